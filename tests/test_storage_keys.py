"""`safe_key` and the confinement it gives: a table of hostile object names, and properties (hypothesis) that no
name it accepts, joined under a local store's root, reaches outside it, and that writing it through the store puts
the file inside the root.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from providers.storage import LocalStore, UnsafeKey, copy_checkpoint, parse_uri, safe_key
from providers.storage.keys import MAX_KEY_BYTES, safe_list_prefix, safe_segment, safe_store_prefix

HOSTILE = [
    ("", "empty"),
    ("/etc/passwd", "absolute"),
    ("/", "absolute"),
    ("..", "'..'"),
    ("../x.pth", "'..'"),
    ("a/../../x.pth", "'..'"),
    ("a/..", "'..'"),
    (".", "'.'"),
    ("./a", "'.'"),
    ("a/./b", "'.'"),
    ("a//b", "empty path segment"),
    ("a/", "empty path segment"),
    ("..\\x.pth", "backslash"),
    ("a\\b", "backslash"),
    ("a\x00b", "control character"),
    ("a\nb", "control character"),
    ("a\rb", "control character"),
    ("a\x1bb", "control character"),
    ("a\x7fb", "control character"),
    ("a\x85b", "control character"),  # C1
    ("a\ud800b", "UTF-8"),  # a lone surrogate (an undecodable file name)
    ("a" * (MAX_KEY_BYTES + 1), "bytes long"),
    ("é" * (MAX_KEY_BYTES // 2 + 1), "bytes long"),  # 2 bytes each in UTF-8
]


@pytest.mark.parametrize(("key", "reason"), HOSTILE, ids=[repr(k[:20]) for k, _ in HOSTILE])
def test_safe_key_refuses_hostile_names(key: str, reason: str) -> None:
    with pytest.raises(UnsafeKey) as err:
        safe_key(key)
    assert reason in str(err.value)


@pytest.mark.parametrize(
    "key",
    ["a", "model.pt", "runs/llm-7b/step-100/model.pt", "a b/c", "...", "..a", "a..", ".hidden", "%2e%2e", "é/ü"],
)
def test_safe_key_accepts_ordinary_names(key: str) -> None:
    assert safe_key(key) == key


def test_percent_encoded_dot_segments_are_refused_once_decoded() -> None:
    for uri in ("s3://b/a/%2e%2e/x", "s3://b/a/%2E%2E/x", "file:///srv/a/%2e%2e/x", "s3://b/a/..%2fx"):
        key = parse_uri(uri).key
        with pytest.raises(UnsafeKey, match=r"'\.\.'"):
            safe_key(key.lstrip("/"))


def test_segment_and_prefix_checks() -> None:
    assert safe_segment("acme") == "acme"
    for bad in ("a/b", "..", "", "a\x00"):
        with pytest.raises(UnsafeKey):
            safe_segment(bad)
    assert safe_store_prefix("") == "" and safe_store_prefix("a/b/") == "a/b/"
    for bad in ("a", "/a/", "a//", "../"):
        with pytest.raises(UnsafeKey):
            safe_store_prefix(bad)
    assert (
        safe_list_prefix("") == "" and safe_list_prefix("runs/") == "runs/" and safe_list_prefix("runs/ll") == "runs/ll"
    )
    for bad in ("runs//", "../", "/runs"):
        with pytest.raises(UnsafeKey):
            safe_list_prefix(bad)


# Keys built from the characters that matter for escaping (segment by segment, so many pass and are checked),
# plus arbitrary text.
_CHARS = st.sampled_from(["."] * 3 + list("abé- %~:") * 2 + ["\\", "\x00", "\n"])
_SEGMENTS = st.lists(st.text(_CHARS, min_size=1, max_size=4), min_size=1, max_size=6).map("/".join)
_KEYS = st.one_of(_SEGMENTS, _SEGMENTS, _SEGMENTS, _SEGMENTS.map(lambda k: "/" + k), st.text(max_size=30))


@given(_KEYS)
@settings(max_examples=500, deadline=None)
def test_no_accepted_key_leaves_the_root_lexically(key: str) -> None:
    try:
        safe_key(key)
    except UnsafeKey:
        return  # refused: nothing can reach anywhere
    root = "/srv/ckpt/tenants/acme/jobs/j1/checkpoint"
    joined = os.path.normpath(os.path.join(root, key))
    assert os.path.commonpath([root, joined]) == root and joined != root
    assert LocalStore(root).path(key) == Path(root, key)


@given(_KEYS)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_accepted_key_written_through_a_local_store_lands_outside_its_root(key: str) -> None:
    try:
        safe_key(key)
    except UnsafeKey:
        return
    if key.endswith(".partial"):
        return
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "src").mkdir()
        (base / "src" / "ckpt.bin").write_bytes(b"weights")
        root = base / "store"
        copy_checkpoint(LocalStore(base / "src"), "ckpt.bin", LocalStore(root), key, chunk_size=5 * 1024 * 1024)
        written = [Path(d, f) for d, _, files in os.walk(base) for f in files]
        assert sorted(written) == sorted([base / "src" / "ckpt.bin", root / key])
        assert (root / key).resolve().is_relative_to(root.resolve())
