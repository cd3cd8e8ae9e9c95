"""Sphinx settings for q2real's documentation: Markdown pages (MyST), built strictly by the tests.

Build it with `sphinx-build -W --keep-going -n docs docs/_build` (the tests do, into a temporary
folder): a warning (a broken link, a page in no table of contents, a missing image) fails the build.
"""

project = "q2real"
author = "q2real developers"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]
# `[text](page.md#a-heading)` links resolve to headings down to level 3, and are checked.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]
html_theme = "furo"
html_title = "q2real"
suppress_warnings: list[str] = []
