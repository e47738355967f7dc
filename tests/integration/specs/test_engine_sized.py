"""The shipped Llama-3 spec, unedited, serves an engine of any tensor-parallel size (issue #46):
its `tensor_parallel: {size: engine}` leaves the size to the engine's registering ranks. Over the
real host path (refitd, one example engine process per rank in POSIX shm, the example trainer),
the same file serves a single engine (no tp fields, as before engine ranks), TP=2 and TP=4: three
refits leave every rank holding `refitctl convert`'s engine layout for it, and once the first rank
fixed the size, a rank registering another size is refused naming tp_size."""
import subprocess

import pytest

from conftest import SRC, convert, make_checkpoint
import refit_harness as h

MODELS = SRC / "deploy/models"
SPEC = str(MODELS / "llama3_fp8.yaml")
# 4 key/value heads of 128 and an intermediate size of 1024: at TP=1, 2 and 4 every rank's q/k/v
# and gate/up rows, and o/down columns, are whole 128-blocks.
SIZES = {"num_key_value_heads": 4, "intermediate_size": 1024}


def test_the_shipped_spec_states_no_size():
    for spec in ("llama3_fp8.yaml", "llama3_fp8_ue8m0.yaml"):
        assert "\ntensor_parallel: {size: engine}\n" in (MODELS / spec).read_text(), spec


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_the_shipped_spec_unedited_refits_an_engine_of_the_size_its_ranks_register(tp, family_node, tmp_path):
    ckpts = [make_checkpoint("llama3", tmp_path / f"ckpt{s}", s, SIZES) for s in range(4)]
    conv = [convert(SPEC, c, tmp_path / f"conv{i}") for i, c in enumerate(ckpts)]
    node = family_node(SPEC, ckpts[0], tp_size=tp)
    assert len(node.engines) == tp
    for i in (1, 2, 3):
        p, lines = node.trainer(ckpts[i], "--expected", str(conv[i]))
        assert p.returncode == 0, p.stdout + p.stderr + node.daemon_log.read_text()[-3000:]
        assert lines[0]["outcome"] == "committed" and lines[0]["engine_matches_expected"], lines
    # The first rank fixed the size: one more engine of another size is refused, naming the field.
    other = 4 if tp == 2 else 2
    log = tmp_path / "other.log"
    shm = h.new_shm("other")
    try:
        p = subprocess.run([str(h.ENGINE), "--address", node.address, "--shm", shm, "--spec", SPEC, "--checkpoint",
                            str(ckpts[0]), "--tp-rank", "0", "--tp-size", str(other)],
                           capture_output=True, text=True, timeout=60)
    finally:
        h.unlink_shm(shm)
    assert p.returncode != 0, p.stdout + p.stderr
    want = (f"tp_size: the engine registers tensor-parallel size {other}, the engine's tensor_parallel.size is "
            f"{tp} (the spec's is 'engine'")
    assert want in p.stdout + p.stderr, p.stdout + p.stderr
