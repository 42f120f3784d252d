"""Strings for Compose and `docker stack deploy`, which interpolate `$VAR` and `${VAR-default}` from the
host's environment in every value of the file they read. Pure."""

from __future__ import annotations


def compose_literal(document: object) -> object:
    """The document with every string value escaped (`$` -> `$$`), so that Compose's interpolation of
    `$VAR`, `${VAR-default}` from the host's environment gives each back as it is: a command, a label, a
    bind source (a folder named `${X-..}` would otherwise become `..` after its path was checked).
    Compose interpolates values only, never keys; `up` has no switch to turn interpolation off."""
    if isinstance(document, str):
        return document.replace("$", "$$")
    if isinstance(document, dict):
        return {key: compose_literal(value) for key, value in document.items()}
    if isinstance(document, list):
        return [compose_literal(value) for value in document]
    return document


def compose_unliteral(document: object) -> object:
    """compose_literal's inverse (a rendered document read back): what Compose hands the engine."""
    if isinstance(document, str):
        return document.replace("$$", "$")
    if isinstance(document, dict):
        return {key: compose_unliteral(value) for key, value in document.items()}
    if isinstance(document, list):
        return [compose_unliteral(value) for value in document]
    return document
