"""BPE merges of a SentencePiece vocabulary (GGUF keeps pieces and scores, no merges), built fast.

The list is transformers' ``generate_merges`` (every split of a piece into two pieces of the
vocabulary, best-scored piece first, ties to the longer left part), which a Python loop takes
seconds to build for Gemma's 256k pieces at every load. Here it is built with numpy: every split's
two halves are looked up by a position-free rolling hash of (text, length), each candidate is then
checked character by character (a hash collision can only add work, never a wrong merge), and one
stable sort gives transformers' order. The result is also kept under the user's cache dir, keyed
by a hash of the pieces and scores, as a plain int32 array of token ids (``np.load`` with pickle
refused) sealed with a digest of the key and the ids, and checked on read (seal, shape, ids in
range): a damaged or foreign file is rebuilt, never trusted.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)
Triples = tuple[np.ndarray, np.ndarray, np.ndarray]  # (piece, first part, second part) ids

CACHE_VERSION = 1  # bump when the merge order changes: old files are then simply not found
_B = 0x9E3779B97F4A7C15  # odd, so invertible modulo 2**64
_B_INV = pow(_B, -1, 1 << 64)
_LEN_MIX = np.uint64(0xD6E8FEB86659FD93)


def merges_from_scores(tokens: list[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    return _pieces(tokens, merge_ids(tokens, scores))


def cached_merges(tokens: list[str], scores: Sequence[float], flavor: str) -> list[tuple[str, str]]:
    """``merges_from_scores`` through the cache (a miss builds and stores; any cache trouble is a
    debug log line and a rebuild, never an error)."""
    cache = _cache_file(tokens, scores, flavor)
    ids = _read(*cache, len(tokens)) if cache is not None else None
    if ids is None:
        ids = merge_ids(tokens, scores)
        if cache is not None:
            _write(*cache, ids)
    return _pieces(tokens, ids)


def _pieces(tokens: list[str], ids: np.ndarray) -> list[tuple[str, str]]:
    pairs = np.array(tokens, dtype=object)[ids.reshape(-1, 2)]  # gathered in C, not in a Python loop
    return list(zip(pairs[:, 0].tolist(), pairs[:, 1].tolist()))


# -- construction -----------------------------------------------------------------------------------
def merge_ids(tokens: list[str], scores: Sequence[float]) -> np.ndarray:
    """[M, 2] int32 token ids (each piece's last position, like transformers' vocab dict)."""
    index = {t: i for i, t in enumerate(tokens)}  # a piece given twice: its last position
    ranked = dict(zip(tokens, scores))  # first-position order, last score (generate_merges' dict)
    uniq = list(ranked)
    pairs = _vectorised(uniq) if uniq else (np.zeros(0, np.int64),) * 3
    if pairs is None:  # two different pieces with one key (a crafted vocabulary): the plain loop
        pairs = _looped(uniq)
    tok, a, b = pairs
    last = np.fromiter((index[t] for t in uniq), dtype=np.int64, count=len(uniq))
    score = np.fromiter(map(float, ranked.values()), dtype=np.float64, count=len(uniq))
    lens = np.fromiter(map(len, uniq), dtype=np.int64, count=len(uniq))
    # generate_merges: pieces in order, each one's splits by (id left, id right), then a stable sort
    # by (score, len left, len right) descending
    order = np.lexsort((last[b], last[a], tok, -lens[b], -lens[a], -score[tok]))
    return np.stack([last[a[order]], last[b[order]]], axis=1).astype(np.int32).reshape(-1, 2)


def _vectorised(uniq: list[str]) -> Triples | None:
    """(piece, left, right) positions in ``uniq`` of every split of a piece into two pieces."""
    U = len(uniq)
    lens = np.fromiter(map(len, uniq), dtype=np.int64, count=U)
    starts = np.zeros(U + 1, dtype=np.int64)
    np.cumsum(lens, out=starts[1:])
    codes = np.frombuffer("".join(uniq).encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.uint64)
    with np.errstate(over="ignore"):  # all hash arithmetic is modulo 2**64
        prefix = np.zeros(codes.size + 1, dtype=np.uint64)
        np.cumsum(codes * _powers(_B, codes.size)[:-1], out=prefix[1:])
        inverse = _powers(_B_INV, codes.size)

        def key(
            i: np.ndarray, j: np.ndarray
        ) -> np.ndarray:  # hash of the text between global positions i and j, mixed with its length
            return (prefix[j] - prefix[i]) * inverse[i] + (j - i).astype(np.uint64) * _LEN_MIX

        find = _finder(key(starts[:-1], starts[1:]))
        if find is None:
            return None
        n_splits = np.maximum(lens - 1, 0)
        tok = np.repeat(np.arange(U), n_splits)
        first = np.zeros(U, dtype=np.int64)
        np.cumsum(n_splits[:-1], out=first[1:])
        k = np.arange(tok.size) - first[tok] + 1  # the left part's length
        s, e = starts[tok], starts[tok + 1]
        a, found_a = find(key(s, s + k))
        b, found_b = find(key(s + k, e))
    keep = np.flatnonzero(found_a & found_b & (lens[a] == k) & (lens[b] == lens[tok] - k))
    tok, k, a, b = tok[keep], k[keep], a[keep], b[keep]
    same = _spells(codes, starts, tok, k, a, b, lens)
    return tok[same], a[same], b[same]


def _spells(
    codes: np.ndarray,
    starts: np.ndarray,
    tok: np.ndarray,
    k: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    lens: np.ndarray,
) -> np.ndarray:
    """For each candidate: do piece a then piece b spell piece tok, character for character?"""
    if tok.size == 0:
        return np.zeros(0, dtype=bool)
    n = lens[tok]
    seg = np.zeros(tok.size, dtype=np.int64)
    np.cumsum(n[:-1], out=seg[1:])
    c = np.repeat(np.arange(tok.size), n)
    j = np.arange(int(n.sum())) - seg[c]
    src = np.where(j < k[c], starts[a[c]] + j, starts[b[c]] + j - k[c])
    return np.minimum.reduceat((codes[starts[tok[c]] + j] == codes[src]).astype(np.int8), seg).astype(bool)


def _powers(base: int, n: int) -> np.ndarray:
    out = np.full(n + 1, base, dtype=np.uint64)
    out[0] = 1
    with np.errstate(over="ignore"):
        return np.cumprod(out, dtype=np.uint64)


def _finder(table: np.ndarray) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None:
    """keys → (position in ``table``, found), through a direct-address table on the keys' top bits
    (one random read per key); the few slots two pieces share go through a sorted search. None when
    two pieces have the same key."""
    bits = max(16, (8 * table.size).bit_length())
    shift = np.uint64(64 - bits)
    slot = (table >> shift).astype(np.int64)
    counts = np.bincount(slot, minlength=1 << bits)
    direct = np.full(1 << bits, -1, dtype=np.int64)
    alone = counts[slot] == 1
    direct[slot[alone]] = np.flatnonzero(alone)
    shared = np.flatnonzero(~alone)
    shared = shared[np.argsort(table[shared], kind="stable")]
    shared_keys = table[shared]
    if np.any(shared_keys[1:] == shared_keys[:-1]):
        return None

    def find(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s = (keys >> shift).astype(np.int64)
        pos = direct[s]
        hit = pos >= 0
        pos = np.where(hit, pos, 0)
        hit &= table[pos] == keys
        busy = np.flatnonzero(counts[s] > 1)
        if busy.size:
            p = np.minimum(np.searchsorted(shared_keys, keys[busy]), shared.size - 1)
            ok = shared_keys[p] == keys[busy]
            pos[busy[ok]], hit[busy[ok]] = shared[p[ok]], True
        return pos, hit

    return find


def _looped(uniq: list[str]) -> Triples:
    where = {t: i for i, t in enumerate(uniq)}
    found = [
        (i, where[t[:k]], where[t[k:]])
        for i, t in enumerate(uniq)
        for k in range(1, len(t))
        if t[:k] in where and t[k:] in where
    ]
    arr = np.array(found, dtype=np.int64).reshape(-1, 3)
    return arr[:, 0], arr[:, 1], arr[:, 2]


# -- cache ------------------------------------------------------------------------------------------
def _cache_dir() -> Path:
    override = os.environ.get("OPSCOPE_CACHE_DIR")  # what engine.bench.paths honours too
    if override:
        return Path(override) / "spm-merges"
    import platformdirs

    return Path(platformdirs.user_cache_dir("opscope")) / "spm-merges"


def _cache_file(tokens: list[str], scores: Sequence[float], flavor: str) -> tuple[Path, bytes] | None:
    """The cache file of this vocabulary and its key (the digest of the pieces and scores)."""
    h = hashlib.sha256(f"v{CACHE_VERSION}\0{flavor}\0{len(tokens)}\0".encode())
    h.update("\0".join(tokens).encode("utf-8", "surrogatepass"))
    h.update(np.asarray(scores, dtype=np.float64).tobytes())
    try:
        return _cache_dir() / f"{h.hexdigest()}.npy", h.digest()
    except Exception as e:  # no usable cache dir: build every time
        log.debug("no cache dir for SentencePiece merges: %s", e)
        return None


def _sealed(ids: np.ndarray, key: bytes) -> np.ndarray:
    """The ids behind 4 rows holding sha256(vocabulary key + ids): a file cut short, damaged, or
    written for another vocabulary is told apart on read (ids in range keep any slip harmless)."""
    seal = np.frombuffer(hashlib.sha256(key + ids.tobytes()).digest(), dtype=np.int32).reshape(4, 2)
    return np.concatenate([seal, ids])


def _read(file: Path, key: bytes, n: int) -> np.ndarray | None:
    """The cached ids, or None when absent or not sealed for this vocabulary (then rebuilt)."""
    try:
        stored = np.load(file, allow_pickle=False)  # data only: an object array is refused
    except FileNotFoundError:
        return None
    except Exception as e:  # whatever a damaged file makes np.load raise, the cache is only a shortcut
        log.debug("ignoring unreadable merge cache %s: %s", file, e)
        return None
    ok = stored.dtype == np.int32 and stored.ndim == 2 and stored.shape[0] > 4 and stored.shape[1] == 2
    ids = np.ascontiguousarray(stored[4:]) if ok else None
    if ids is None or not (
        np.array_equal(_sealed(ids, key)[:4], stored[:4]) and int(ids.min()) >= 0 and int(ids.max()) < n
    ):
        log.debug("ignoring merge cache %s: not sealed for this vocabulary", file)
        return None
    return ids


def _write(file: Path, key: bytes, ids: np.ndarray) -> None:
    if ids.size == 0:
        return
    import threading

    tmp = file.with_name(f"{file.stem}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.save(f, _sealed(np.ascontiguousarray(ids, dtype=np.int32), key), allow_pickle=False)
        os.replace(tmp, file)  # readers see the whole file or none
    except OSError as e:
        log.debug("could not keep the merge cache %s: %s", file, e)
        try:
            tmp.unlink()
        except OSError:
            pass
