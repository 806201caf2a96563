"""The `draftgate` command; nothing in the server imports it."""
