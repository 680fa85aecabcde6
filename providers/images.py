"""Container image references: the OCI distribution grammar, so a job's `image` can only ever be an image name.

`validate_image(ref) -> str` returns the reference unchanged when it matches the grammar of the distribution
project's `reference` package (what `docker pull` and `podman pull` accept), and raises `ValueError` saying what is
wrong otherwise:

    reference  := name [":" tag] ["@" digest]
    name       := [domain "/"] path-component ["/" path-component]*      (at most 255 characters)
    domain     := host [":" port]          host: DNS name or [IPv6]; any case
    path-component := [a-z0-9]+ (separator [a-z0-9]+)*      separator: "." | "_" | "__" | "-"+
    tag        := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
    digest     := algorithm ":" hex{32,}   algorithm: [A-Za-z][A-Za-z0-9]* joined by one of "+.-_"

The whole reference is at most 300 characters. A reference therefore never starts with "-" and holds no
whitespace, control character, quote or shell metacharacter: it cannot be read as an option of `docker run` or
`docker pull`, nor split into several arguments. (The start-up script also passes it after `--`.)
"""

from __future__ import annotations

import re

MAX_NAME = 255
MAX_REFERENCE = 300

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|-+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_DOMAIN = rf"{_HOST}(?::[0-9]+)?"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::{_TAG})?(?:@{_DIGEST})?", re.ASCII)


def validate_image(ref: str) -> str:
    """`ref` if it is a valid image reference (see the module docstring); `ValueError` naming the fault if not."""
    if not ref:
        raise ValueError("must not be empty")
    if len(ref) > MAX_REFERENCE:
        raise ValueError(f"longer than {MAX_REFERENCE} characters")
    if ref.startswith("-"):
        raise ValueError("must not start with '-' (it would be read as an option)")
    if any(c.isspace() or not c.isprintable() for c in ref):
        raise ValueError("must not contain whitespace or control characters")
    match = _REFERENCE.fullmatch(ref)
    if match is None:
        raise ValueError(
            "not an image reference: [registry[:port]/]path[:tag][@algorithm:hex], lowercase path components "
            "(e.g. ghcr.io/acme/train:1.4)"
        )
    if len(match.group("name")) > MAX_NAME:
        raise ValueError(f"image name longer than {MAX_NAME} characters")
    return ref
