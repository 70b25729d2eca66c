"""docs/design.md, "Errors: three conventions": nothing below launcher/commands/ prints. A helper returns its error
(a bool or an outcome enum with `std::string* err`, a `Status`, the config's `ConfigError`s) or says it through
the console and the logs; only an entry point, whose documented output is its stdout/stderr, prints. The entry
points that may are listed here and in design.md; a print anywhere else fails."""
import re

from conftest import ROOT

SOURCE_DIRS = ("launcher", "common", "contract", "store", "cachelock", "worker")
# Entry points: their main or the subcommands main calls, whose output is the tool's documented output.
MAY_PRINT = {
    "launcher/supervise/guardian_main.cc",  # dflash-guardian: its one line on stderr (the attempt's record)
    "launcher/console/log_test_writer.cc",  # a test tool's usage line
    "worker/main.cc",                       # dflash-worker: its stderr is the attempt's stderr.log
    "worker/cachelock_run.cc",              # dflash-cachelock-run's entry point (CachelockRunMain)
    "worker/builtin/main.cc",               # dflash-builtin: the payload's own output
    "worker/builtin/roles.cc",              # dflash-builtin's subcommands (check-frame, loss: stdout is their answer)
    "cachelock/cli.cc",                     # dflash-cachelock status|forget (CachelockMain)
    "cachelock/test_contender.cc",          # a test tool
}
PRINTS = re.compile(r"\bf?printf\s*\(\s*(?:stderr|stdout)?|std::(?:cerr|cout)\b|\bf?puts\s*\(|\bperror\s*\(")


def printing_files(root=ROOT):
    found = {}
    for d in SOURCE_DIRS:
        for path in sorted((root / d).rglob("*.cc")) + sorted((root / d).rglob("*.h")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith("launcher/commands/") or rel.endswith("_test.cc"):
                continue
            code = re.sub(r"//[^\n]*", "", path.read_text(errors="replace"))  # a comment may say "printf"
            code = re.sub(r"\b(?:v?s|vf)n?printf\s*\(", "", code)  # formatting into a buffer prints nothing
            hits = [m.group(0) for m in PRINTS.finditer(code)]
            if hits:
                found[rel] = hits
    return found


def test_nothing_prints_below_commands_but_the_entry_points():
    found = printing_files()
    stray = sorted(set(found) - MAY_PRINT)
    assert not stray, f"these print below launcher/commands/ (return the error, or log it): {stray}"


def test_every_entry_point_allowed_to_print_still_does_and_design_md_names_it():
    found = printing_files()
    design = (ROOT / "docs" / "design.md").read_text()
    assert MAY_PRINT <= set(found), f"allowed but no longer printing (shorten the list): {sorted(MAY_PRINT - set(found))}"
    unnamed = [f for f in sorted(MAY_PRINT) if f"`{f}`" not in design]
    assert not unnamed, f"docs/design.md does not name these entry points that print: {unnamed}"


def test_the_check_sees_a_planted_print(tmp_path):
    planted = tmp_path / "launcher" / "core" / "planted.h"
    planted.parent.mkdir(parents=True)
    planted.write_text('#include <cstdio>\n// printf( in a comment is no print\n'
                       'inline void Oops() { char b[8]; std::snprintf(b, 8, "x"); std::fprintf(stderr, "x\\n"); }\n')
    (tmp_path / "launcher" / "commands").mkdir()
    (tmp_path / "launcher" / "commands" / "say.cc").write_text('void Say() { std::fputs("x", stderr); }\n')
    assert printing_files(tmp_path) == {"launcher/core/planted.h": ["fprintf(stderr"]}
