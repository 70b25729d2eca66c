"""docs/exit-codes.md lists exactly the codes of common/exit_codes.h, with the same meaning; the Python package's
copies of a code are the header's number (one source per fact)."""
import re

from conftest import ROOT


def header_codes(text):
    """code -> meaning, from `constexpr int kName = N;  // meaning (detail); more`."""
    codes = {}
    for m in re.finditer(r"constexpr int k\w+ = (\d+);\s*//\s*(.+)", text):
        codes[int(m.group(1))] = m.group(2).strip()
    return codes


def doc_codes(text):
    """code -> meaning, from the `| code | meaning | who |` table (128+N is 128)."""
    codes = {}
    for m in re.finditer(r"^\| (\d+)(?:\+N)? \| (.+?) \| .* \|$", text, re.M):
        codes[int(m.group(1))] = m.group(2)
    return codes


def essence(meaning):
    """What must match: the text before any ';', without (parentheses), `code` marks or **bold**."""
    meaning = re.sub(r"\([^()]*\)", "", meaning.split(";")[0])
    meaning = meaning.replace("`", "").replace("**", "")
    return " ".join(meaning.split()).rstrip(" :,.").lower()


def disagreements(header_text, doc_text):
    header, doc = header_codes(header_text), doc_codes(doc_text)
    problems = [f"{c}: in common/exit_codes.h, not in docs/exit-codes.md" for c in sorted(header.keys() - doc.keys())]
    problems += [f"{c}: in docs/exit-codes.md, not in common/exit_codes.h" for c in sorted(doc.keys() - header.keys())]
    for c in sorted(header.keys() & doc.keys()):
        want = essence(header[c])
        if want not in essence(doc[c]).replace(" ,", ","):
            problems.append(f"{c}: the header says {want!r}, the doc {doc[c]!r}")
    return problems


def read(rel):
    return (ROOT / rel).read_text()


def test_the_doc_lists_exactly_the_headers_codes_with_the_same_meaning():
    header, doc = read("common/exit_codes.h"), read("docs/exit-codes.md")
    assert len(header_codes(header)) >= 11 and len(doc_codes(doc)) >= 11  # both parsed
    assert disagreements(header, doc) == []


def test_a_drifted_doc_is_caught():
    header, doc = read("common/exit_codes.h"), read("docs/exit-codes.md")
    missing = "\n".join(l for l in doc.splitlines() if not l.startswith("| 65 |"))
    assert disagreements(header, missing) == ["65: in common/exit_codes.h, not in docs/exit-codes.md"]
    extra = doc + "\n| 68 | host name unknown | all |\n"
    assert disagreements(header, extra) == ["68: in docs/exit-codes.md, not in common/exit_codes.h"]
    reworded = doc.replace("| 75 | timed out:", "| 75 | gave up:")
    assert [p[:4] for p in disagreements(header, reworded)] == ["75: "]


def test_pythons_frame_contract_code_is_the_headers():
    from dflash_launch import spool
    codes = {m.group(1): int(m.group(2))
             for m in re.finditer(r"constexpr int (k\w+) = (\d+);", read("common/exit_codes.h"))}
    assert spool.EXIT_FRAME_CONTRACT == codes["kFrameContract"]


def test_pythons_checkpoint_refused_code_is_the_headers():
    from dflash_launch import checkpoint
    codes = {m.group(1): int(m.group(2))
             for m in re.finditer(r"constexpr int (k\w+) = (\d+);", read("common/exit_codes.h"))}
    assert checkpoint.EXIT_CHECKPOINT_REFUSED == codes["kCheckpointRefused"] == checkpoint.CheckpointRefused.exit_code
