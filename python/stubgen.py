#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the type stubs of the compiled half of the package stoker (python/stoker/_stoker.pyi and
gpu.pyi) from the built module, so that an IDE completes it and mypy checks code that uses it; the
package's Python files (__init__.py, loader.py) carry their own annotations.

    PYTHONPATH=build/python python3 python/stubgen.py            # writes python/stoker/*.pyi
    PYTHONPATH=build/python python3 python/stubgen.py --check    # fails if they differ

Everything comes from the module itself: its classes, their methods and properties with the
signatures pybind11 writes at the top of each docstring, its functions, its exceptions (and the
attributes they declare in __annotations__), and the names the package takes from its Python
files. tests/python/test_stubs.py checks that the stubs in the tree are what this makes.
"""

import argparse
import inspect
import pathlib
import re
import sys
import textwrap

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "stoker"
HEADER = "# SPDX-License-Identifier: Apache-2.0\n# Generated from the built module by python/stubgen.py: do not edit by hand.\n"

# Dunder methods that say what a class can do; pybind11's own and object's others are left out.
DUNDERS = {"__init__", "__len__", "__iter__", "__next__", "__getitem__", "__enter__", "__exit__", "__eq__",
           "__dlpack__", "__dlpack_device__", "__array__"}
DUNDER_PROPERTIES = {"__array_interface__", "__cuda_array_interface__"}
TYPING = ["Any", "Callable", "Dict", "Iterator", "List", "Optional", "Sequence", "Tuple", "Union"]


def split_top(text, sep=","):
    """`text` split at `sep` outside brackets and quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for i, c in enumerate(text):
        if quote:
            if c == quote and text[i - 1] != "\\":
                quote = None
        elif c in "'\"":
            quote = c
        elif c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


class Names:
    """How a stub file spells the types pybind11 names in its signatures."""

    def __init__(self, own):
        self.own = own  # "stoker" or "stoker.gpu": its classes are spelled bare

    def __call__(self, t):
        t = t.strip()
        t = re.sub(r"numpy\.ndarray\[[^\]]*\]", "numpy.ndarray", t)
        t = re.sub(r"(\w+)\[\d+\]", r"\1", t)  # std::array's "float[2]"
        t = re.sub(r"\bfunction\b", "Callable[..., Any]", t)
        t = re.sub(r"\bos\.PathLike\b", "Union[str, os.PathLike]", t)  # pybind11's path caster takes both
        t = re.sub(r"\bstoker\.gpu\.(\w+)", lambda m: m.group(1) if self.own == "stoker.gpu" else "gpu." + m.group(1), t)
        if self.own == "stoker":
            t = re.sub(r"\bstoker\.(\w+)", r"\1", t)
        return t


def parse(doc, name):
    """The signatures at the top of a pybind11 docstring: [(params, return)] and the text after."""
    lines = (doc or "").splitlines()
    sigs, rest = [], lines
    if lines and lines[0].startswith(name + "("):
        sigs, rest = [lines[0]], lines[1:]
    elif lines and lines[0] == "Overloaded function.":
        sigs = [l.split(". ", 1)[1] for l in lines if re.match(r"^\d+\. " + re.escape(name) + r"\(", l)]
        rest = []
    out = []
    for sig in sigs:
        m = re.match(re.escape(name) + r"\((.*)\)(?: -> (.*))?$", sig)
        if not m:
            raise SystemExit(f"stubgen.py: cannot read the signature of {name}: {sig!r}")
        out.append((split_top(m.group(1)), m.group(2) or "None"))
    return out, "\n".join(rest).strip()


def param(p, names, first):
    if p in ("*", "/") or p.startswith("*"):
        return p
    name, _, rest = p.partition(":")
    if first and name.strip() == "self":
        return "self"
    annotation, default = (split_top(rest, "=") + [None])[:2] if rest else ("Any", None)
    text = f"{name.strip()}: {names(annotation)}"
    return text + (" = ..." if default is not None else "")


def method(name, fn, names, indent, static=False, shadows=False):
    sigs, doc = parse(getattr(fn, "__doc__", ""), name)
    if not sigs:  # a class without a constructor: Python cannot make one either
        return []
    if name == "__eq__":  # object's: any other object, False or NotImplemented for the rest
        return [f"{indent}def __eq__(self, other: object) -> bool: ..."]
    lines = []
    for params, ret in sigs:
        if len(sigs) > 1:
            lines.append(f"{indent}@overload")
        if static:
            lines.append(f"{indent}@staticmethod")
        ps = [param(p, names, i == 0 and not static) for i, p in enumerate(params)]
        # A factory of a derived class (SlotPool.create) shadows its base's with other arguments.
        ignore = "  # type: ignore[override]" if shadows else ""
        lines.append(f"{indent}def {name}({', '.join(ps)}) -> {names(ret)}: ...{ignore}")
    if doc and len(sigs) == 1 and not shadows:
        lines[-1] = lines[-1][:-4]
        lines.append(textwrap.indent(f'"""{doc}"""', indent + "    "))
        lines.append(f"{indent}    ...")
    return lines


def prop(name, p, names, indent):
    sigs, doc = parse(p.fget.__doc__ if p.fget else "", "")
    if not sigs:  # def_readonly's getters have "(self: X) -> T" with an empty name
        m = re.match(r"\(self: [^)]*\) -> (.*)", (p.fget.__doc__ or "").splitlines()[0] if p.fget else "")
        ret = m.group(1) if m else "Any"
        doc = "\n".join((p.fget.__doc__ or "").splitlines()[1:]).strip() if p.fget else ""
    else:
        ret = sigs[0][1]
    if p.fset is not None:
        return [f"{indent}{name}: {names(ret)}"]
    lines = [f"{indent}@property", f"{indent}def {name}(self) -> {names(ret)}: ..."]
    if doc:
        lines[-1] = lines[-1][:-4]
        lines += [textwrap.indent(f'"""{doc}"""', indent + "    "), f"{indent}    ..."]
    return lines


def klass(cls, names):
    bases = [b for b in cls.__bases__ if b.__name__ != "pybind11_object"]
    base = ", ".join(names(f"{b.__module__}.{b.__name__}") if b.__module__.startswith("stoker") else b.__name__
                     for b in bases)
    lines = [f"class {cls.__name__}({base}):" if base else f"class {cls.__name__}:"]
    if cls.__doc__ and not issubclass(cls, BaseException):
        lines.append(textwrap.indent(f'"""{inspect.cleandoc(cls.__doc__)}"""', "    "))
    body = []
    if issubclass(cls, BaseException):
        for attr, t in getattr(cls, "__annotations__", {}).items():
            body.append(f"    {attr}: {t}")
    for name, v in sorted(cls.__dict__.items()):
        if name.startswith("_") and name not in DUNDERS | DUNDER_PROPERTIES:
            continue
        if isinstance(v, staticmethod):
            shadows = any(name in vars(b) for b in cls.__mro__[1:])
            body += method(name, v.__func__, names, "    ", static=True, shadows=shadows)
        elif isinstance(v, property):
            body += prop(name, v, names, "    ")
        elif callable(v):
            body += method(name, v, names, "    ")
    if not body and len(lines) == 1:
        body = ["    ..."]
    return lines + body


def module_stub(mod, own, imports):
    names = Names(own)
    classes, functions = [], []
    for name, v in sorted(vars(mod).items()):
        if name.startswith("_"):
            continue
        if inspect.isclass(v) and v.__module__ == own:
            classes.append(v)
        elif callable(v) and not inspect.isclass(v) and not inspect.ismodule(v):
            functions.append((name, v))
    # Bases before the classes that derive from them.
    ordered = []
    while classes:
        for c in classes:
            if not any(b in classes for b in c.__bases__):
                ordered.append(c)
                classes.remove(c)
                break
    body = []
    for c in ordered:
        body += [""] + klass(c, names) + [""]
    for name, fn in functions:
        body += [""] + method(name, fn, names, "")
    text = "\n".join(body)
    used = [t for t in TYPING if re.search(r"\b" + t + r"\b", text)]
    head = [HEADER.rstrip()]
    if mod.__doc__:
        head.append(f'"""{mod.__doc__}"""')
    head.append("")
    if "overload" in text:
        used.append("overload")
    if used:
        head.append(f"from typing import {', '.join(sorted(used))}")
    for imp in imports:
        head.append(imp)
    if re.search(r"\bnumpy\.", text):
        head.append("import numpy")
    if re.search(r"\bos\.", text):
        head.append("import os")
    return "\n".join(head) + "\n" + text.rstrip() + "\n"


def stubs():
    # The built package, not the sources beside this script (which have no compiled module).
    sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
    import stoker
    from stoker import _stoker
    top = module_stub(_stoker, "stoker", ["from . import gpu as gpu"])
    top = top.rstrip() + "\n\n__version__: str\n"
    gpu = module_stub(stoker.gpu, "stoker.gpu", ["import stoker"])
    return {"_stoker.pyi": top, "gpu.pyi": gpu}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="fail, saying which file, if the stubs in the tree differ")
    args = p.parse_args()
    stale = []
    for name, text in stubs().items():
        path = OUT / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
    if stale:
        sys.exit("stubgen.py: out of date (PYTHONPATH=build/python python3 python/stubgen.py rewrites them): "
                 + ", ".join(stale))


if __name__ == "__main__":
    main()
