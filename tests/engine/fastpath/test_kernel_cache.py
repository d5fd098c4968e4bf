"""engine/fastpath/kernels/cache.py: which names are cache entries, and pruning a cache directory
on disk (the build's own path through it is in test_kernel_build.py)."""

from __future__ import annotations

import os

from opscope.engine.fastpath.kernels import cache


def test_an_entry_name_splits_into_its_prefix_and_a_16_digit_key():
    assert cache.split("opscope_qlinear_avx2_vnni_14c20d492930ea39") == (
        "opscope_qlinear_avx2_vnni_",
        "14c20d492930ea39",
    )
    assert cache.split("opscope_torch_half_x86_64_383749be47fb7afa") == (
        "opscope_torch_half_x86_64_",
        "383749be47fb7afa",
    )
    for name in ("opscope_qlinear_avx2_vnni_14c20d492930ea39.flock", "14c20d492930ea39", "x_14c20d492930ea3g", "notes"):
        assert cache.split(name) is None


def test_pruning_keeps_the_named_entry_and_the_most_recently_used(tmp_path):
    entries = []
    for i, age in enumerate([50, 10, 40, 20, 30]):
        d = tmp_path / f"opscope_qlinear_avx2_{i:016x}"
        d.mkdir()
        (tmp_path / f"{d.name}.flock").touch()
        os.utime(d, (1e9 - age, 1e9 - age))
        entries.append(d)
    (tmp_path / "README").write_text("not an entry")
    removed = cache.prune(tmp_path, [entries[0].name], keep=3)  # the named one is the oldest
    assert sorted(removed) == sorted([entries[2], entries[4]])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["README", *(n for d in (entries[0], entries[1], entries[3]) for n in (d.name, f"{d.name}.flock"))]
    )


def test_pruning_a_cache_that_is_not_there_removes_nothing(tmp_path):
    assert cache.prune(tmp_path / "missing", ["opscope_qlinear_avx2_0123456789abcdef"]) == []
