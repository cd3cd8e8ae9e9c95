"""The attribute docstrings of config dataclasses (the string literal after each field), read from the
source: the one text per setting that the config reference (`q2real config --doc`) and a program's
`--help` both show, so the two never differ.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap


def field_docs(cls: type) -> dict[str, str]:
    """Each field's attribute docstring, from the nearest class of `cls`'s bases that gives it one."""
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            docs.update(_declared_docs(base))
    return docs


@functools.cache
def _declared_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings written in `cls`'s own body, each as one line of text."""
    docs = {}
    body = class_node(cls).body
    for node, after in zip(body, body[1:], strict=False):
        text = _string(after)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and text is not None:
            docs[node.target.id] = " ".join(text.split())
    return docs


def class_node(cls: type) -> ast.ClassDef:
    """The syntax tree of `cls`'s definition."""
    node = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(node, ast.ClassDef), cls
    return node


def _string(node: ast.stmt) -> str | None:
    """The text of a statement that is a string literal alone (a docstring), else None."""
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
        return node.value.value
    return None
