"""docs/benchmarks.md is one file of "## name" sections: a benchmark rewrites its own."""
import pathlib


def write_section(path: pathlib.Path, heading: str, md: str) -> None:
    """Replaces the section that starts with `heading` (up to the next "## "), or appends it."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start = text.find(heading + "\n")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start] + md.strip() + "\n" + (text[end:] if end >= 0 else "")
    else:
        text = text.rstrip() + "\n\n" + md.strip() + "\n"
    path.write_text(text)
