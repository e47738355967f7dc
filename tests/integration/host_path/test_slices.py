"""Sliced pushes end to end on the host path: the example trainer pushes every matrix as slices
(alternately along dimension 0 and 1, last slice first, as tensor-parallel ranks would push
their shards); refitd assembles each tensor before converting it, and the engine must then hold
exactly the offline conversion of the whole tensors. A missing slice is refused at commit,
naming the tensor and the missing rows, with the engine untouched."""
import json
import subprocess

from conftest import BIN


def test_sliced_refits_match_offline_conversion(node_factory):
    # 256 KiB buckets: the 512 KB embedding fits only as slices; slices span buckets.
    node = node_factory(config="limits:\n  bucket_bytes: 262144\n")
    _, lines = node.trainer("--refits", "2", "--slices", "3", check_rc=0)
    assert [l["outcome"] for l in lines] == ["committed"] * 2
    assert all(l["engine_matches_expected"] for l in lines), lines
    _, lines = node.trainer("--refits", "1", "--slices", "2", "--seed", "4", check_rc=0)
    assert lines[0]["engine_matches_expected"]
    # Memory use is reported: the ring is bucket_bytes x bucket_slots (2 by default), in host memory.
    status = json.loads(subprocess.run([str(BIN / "tools/refitctl"), "status", "--json", "--address", node.address],
                                       capture_output=True, text=True, check=True).stdout)
    assert status["ring_bytes"] == 2 * 262144 and status["ring_on_device"] is False, status


def test_missing_slice_is_refused_naming_the_tensor_and_rows(node_factory):
    node = node_factory()
    node.trainer("--refits", "1", check_rc=0)
    before = node.shm_digest()
    _, lines = node.trainer("--refits", "1", "--slices", "4", "--seed", "9", "--fault", "drop-slice", check_rc=0)
    assert lines[0]["outcome"] == "refused"
    error = lines[0]["error"]
    assert "sliced tensor incomplete" in error, error
    assert "tensor 'model.embed_tokens.weight': slices cover 750 of 1000 rows of dimension 0; missing [250, 500)" \
        in error, error
    assert node.shm_digest() == before
