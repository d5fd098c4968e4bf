"""engine.core.gcpause: collection paused over nested and overlapping regions, restored as found."""

import gc
import threading

from opscope.engine import load
from opscope.engine.core.gcpause import gc_paused


def test_nested_regions_resume_collection_when_the_last_one_ends():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer region still holds it
    assert gc.isenabled()


def test_a_region_leaves_collection_off_where_it_found_it_off():
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_regions_overlapping_across_threads_share_one_count():
    inside, release = threading.Event(), threading.Event()

    def worker():
        with gc_paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=worker)
    with gc_paused():
        t.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # this thread's region ended first: the worker's still holds it
    release.set()
    t.join(10)
    assert gc.isenabled()


def test_loading_a_model_sets_off_no_collection_and_leaves_collection_on():
    """A vocabulary's 49k tokens and merges (the embedded model's) are objects kept, not garbage:
    the load runs without collections (unpaused: ~90 young, 9 middle and a full one, which walks the
    whole heap and frees nothing); only the young generation's, as collection resumes, may follow."""
    runs: list[int] = []

    def seen(phase, info):
        if phase == "start":
            runs.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        lm = load(threads=1)
    finally:
        gc.callbacks.remove(seen)
    assert lm.tokenizer.encode("Hello")
    assert runs in ([], [0])
    assert gc.isenabled()
