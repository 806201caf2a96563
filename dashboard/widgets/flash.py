"""A change's confirmation, carried over the rerun that redraws the page with the change.

A page draws its tables before its forms, so a change made by a form would leave the
tables above it as they were. `changed` keeps the message and reruns the page; the rerun
reads every table afresh (the write cleared the read cache) and `show_flash` shows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

import streamlit as st

FLASH_KEY = "draftgate-flash"


@dataclass(frozen=True)
class Flash:
    """What the last change said."""

    message: str
    warnings: tuple[str, ...] = ()
    secret: str | None = None  # shown once beneath the message (a created key)


def changed(message: str, *, warnings: Sequence[str] = (), secret: str | None = None) -> NoReturn:
    """Rerun the page, which then shows `message` above its fresh tables."""
    st.session_state[FLASH_KEY] = Flash(message, tuple(warnings), secret)
    st.rerun()


def show_flash() -> None:
    """The last change's message and warnings, once."""
    flash = st.session_state.pop(FLASH_KEY, None)
    if not isinstance(flash, Flash):
        return
    st.success(flash.message)
    for warning in flash.warnings:
        st.warning(warning)
    if flash.secret is not None:
        st.code(flash.secret, language=None)
