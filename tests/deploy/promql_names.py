"""The metric names a PromQL expression reads, found by a small lexer: enough of PromQL for
dashboards and alert rules (selectors, functions, aggregations with by/without, binary
operators with on/ignoring/group_left/group_right, ranges, subqueries and offsets).

Grafana's template variables are replaced by values PromQL accepts first (grafana_to_promql),
so the same expressions can also be handed to promtool for a syntax check."""
import re

_STRING = re.compile(r'"(?:\\.|[^"\\])*"' r"|'(?:\\.|[^'\\])*'" r"|`[^`]*`")
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w.:])[A-Za-z_:][\w:]*")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
             "unless", "offset", "atan2", "inf", "nan", "Inf", "NaN"}
_GRAFANA_RANGE = re.compile(r"\$(__rate_interval|__interval|__range)\b|\$\{(__rate_interval|__interval|__range)\}")
_GRAFANA_VAR = re.compile(r"\$\{\w+(?::\w+)?\}|\$\w+")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*\w+\s*\)\s*$", re.S)


def grafana_to_promql(expr: str) -> str:
    """Replaces Grafana's interval variables by 5m and other variables (used in regex matchers)
    by .*; a label_values(SELECTOR, LABEL) variable query becomes SELECTOR."""
    m = _LABEL_VALUES.match(expr)
    if m:
        expr = m.group(1)
    expr = _GRAFANA_RANGE.sub("5m", expr)
    return _GRAFANA_VAR.sub(".*", expr)


def metric_names(expr: str) -> set[str]:
    s = _STRING.sub('""', expr)
    s = _BRACES.sub("", s)
    s = _BRACKETS.sub("", s)
    s = _LABEL_LIST.sub(" ", s)
    names = set()
    for m in _IDENT.finditer(s):
        word = m.group(0)
        rest = s[m.end():].lstrip()
        if word in _KEYWORDS or rest.startswith("("):
            continue  # a keyword, or a function or aggregation being called
        names.add(word)
    return names
