"""The profile's table counts a sample for the part of the request path it was taken in."""

from __future__ import annotations

from pathlib import Path

from loadtest.profile import (
    EDGE_FILES,
    ELSEWHERE,
    STAGE_FILES,
    is_work,
    part_of,
    shares,
    work_shares,
)

ROOT = Path(__file__).resolve().parents[2]
LOOP = "run (uvloop/__init__.py:82);_run_once (asyncio/base_events.py:1922)"
GATE = f"{LOOP};__call__ (app/api/gate.py:140);_gated (app/api/gate.py:190)"


def test_a_sample_below_a_stage_counts_for_the_stage_whatever_it_runs() -> None:
    stack = (
        f"{GATE};serve (app/api/recommend.py:250);run (app/pipeline/recommend.py:75);"
        "run_step (app/pipeline/step.py:40);run (app/pipeline/stages/recall.py:50);"
        "candidates (app/pipeline/sources/ann.py:110);search (faiss/class_wrappers.py:469)"
    )
    assert part_of(stack) == "recall"


def test_outside_the_stages_the_innermost_known_part_takes_it() -> None:
    assert part_of(f"{GATE};serve (app/api/recommend.py:250)").startswith("answer")
    assert part_of(f"{GATE};_run (starlette/routing.py:70)").startswith("framework")
    assert part_of(GATE) == "gate"
    assert part_of(LOOP) == "event loop"
    assert part_of("main (somewhere/else.py:1)") == ELSEWHERE


def test_shares_add_up_to_one_largest_first() -> None:
    lines = [f"{GATE} 3\n", f"{LOOP} 1\n", "not a sample line\n"]
    assert shares(lines) == {"gate": 0.75, "event loop": 0.25}


def test_every_file_the_table_names_is_in_the_service() -> None:
    for marker, _ in STAGE_FILES + EDGE_FILES:
        if marker.startswith("app/"):
            assert (ROOT / marker).exists(), marker


NATIVE_RECALL = (
    f"{GATE};run (app/pipeline/stages/recall.py:50);candidates (app/pipeline/sources/ann.py:110);"
    "search (faiss/class_wrappers.py:469)"
)


def test_a_native_sample_is_work_when_its_innermost_code_is_a_work_library() -> None:
    faiss = "faiss::IndexIVFFlat::search (faiss/_swigfaiss.cpython-311-x86_64-linux-gnu.so)"
    copy = "__memmove_avx_unaligned_erms (libc.so.6)"
    gather = "mapiter_get (numpy/_core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so)"
    assert is_work(f"{NATIVE_RECALL};{faiss}")
    assert is_work(f"{NATIVE_RECALL};{gather};{copy};0x7f2d1fd8bb75 (libc.so.6)")
    # The Python around the call, and gRPC's own machinery, are not.
    assert not is_work(NATIVE_RECALL)
    grpc = "__pyx_f_4grpc_7_cython_6cygrpc (grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so)"
    assert not is_work(f"{LOOP};{grpc}")
    assert not is_work(f"{LOOP};{copy}")


def test_work_shares_are_per_part() -> None:
    faiss = "search (faiss/_swigfaiss.cpython-311-x86_64-linux-gnu.so)"
    lines = [f"{NATIVE_RECALL};{faiss} 3\n", f"{NATIVE_RECALL} 1\n", f"{LOOP} 2\n"]
    assert work_shares(lines) == {"recall": 0.75, "event loop": 0.0}
