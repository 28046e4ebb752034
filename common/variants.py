"""Kernel variants made by replacing lines of a part's kernel file: the studies that time a change
(what casting P costs, a launch order, a stage doubled, a candidate optimisation) build each variant
this way, so the variant is the shipped kernel with only the named lines different."""

from common import parts


def apply(source, replacements, where="the kernel"):
    """source with each (old, new) replaced. Each old text must occur exactly once: a kernel edit that
    moves or duplicates it makes the study fail loudly instead of timing the wrong thing."""
    for old, new in replacements:
        count = source.count(old)
        if count != 1:
            raise ValueError(f"expected one {old.strip()!r} in {where}; found {count}")
        source = source.replace(old, new)
    return source


def load(part, replacements, name):
    """Part `part`'s kernel file with the replacements applied, imported as module `name`."""
    return parts.load_source(name, apply(parts.path(part).read_text(), replacements, f"part {part}'s kernel"))
