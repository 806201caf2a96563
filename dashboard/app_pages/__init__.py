"""One module per dashboard page, each with a `render()` that draws it."""
