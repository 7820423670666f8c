"""Prints a package's prose per code line: docstring and comment lines over code lines (blank lines ignored).

Usage: python scripts/prose_ratio.py lightning_hybrid_rollout
"""

import ast
import io
import pathlib
import sys
import tokenize

root = pathlib.Path(sys.argv[1])
prose = code = 0
for p in root.rglob("*.py"):
    src = p.read_text()
    lines = src.splitlines()
    doc_lines = set()
    tree = ast.parse(src)
    for node in ast.walk(tree):
        # docstrings (module, class, function, attribute): string expression statements
        if (
            isinstance(node, ast.Expr)
            and isinstance(getattr(node, "value", None), ast.Constant)
            and isinstance(node.value.value, str)
        ):
            doc_lines.update(range(node.lineno, node.end_lineno + 1))
    comment_lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            comment_lines.add(tok.start[0])
    for i, line in enumerate(lines, 1):
        s = line.strip()
        if not s:
            continue
        if i in doc_lines or (i in comment_lines and s.startswith("#")):
            prose += 1
        else:
            code += 1
print(f"prose {prose} code {code} ratio {prose / code:.3f}")
