"""docs/design.md's room table is true to the code: one row a room, the rooms are the folders of launcher/ that
scripts/check_layers.py registers (each with its own CMake target), and every type the table names is defined in
the project. A room added, moved or renamed without its row (or a row naming a type that does not exist, as
`LiveView`, `RunCommand` and `CheckCommand` once were) fails here."""
import importlib.util
import re

from conftest import ROOT

SOURCE_DIRS = ("launcher", "common", "contract", "worker", "cachelock", "store")
DEFINES = r"(?:class|struct|enum class|using)\s+{0}\b|^\s*(?:int|bool|Status|std::string|void)\s+{0}\("


def room_table(text):
    """room -> the types of its last column, from `| `room/` | what | types |` rows under "room by room"."""
    part = text[text.index("### launcher/, room by room"):]
    part = part[:part.index("\n\n", part.index("| room |"))]
    rows = {}
    for line in part.splitlines():
        m = re.match(r"^\| `(\w+)/` \| .* \| (.*) \|$", line)
        if m:
            assert m.group(1) not in rows, f"two rows for launcher/{m.group(1)}/"
            rows[m.group(1)] = re.findall(r"`(\w+)`", m.group(2))
    return rows


def registered_rooms():
    spec = importlib.util.spec_from_file_location("check_layers", ROOT / "scripts" / "check_layers.py")
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)
    return {name.split("/", 1)[1] for name, _ in layers.LAYERS if name.startswith("launcher/")}


def defined(name):
    pattern = re.compile(DEFINES.format(re.escape(name)), re.M)
    for d in SOURCE_DIRS:
        for path in (ROOT / d).rglob("*.h"):
            if pattern.search(path.read_text(errors="replace")):
                return True
    return False


def test_one_row_a_room_and_a_room_a_row():
    rows = room_table((ROOT / "docs" / "design.md").read_text())
    folders = {p.name for p in (ROOT / "launcher").iterdir() if p.is_dir()}
    assert set(rows) == registered_rooms() == folders, (sorted(rows), sorted(registered_rooms()), sorted(folders))
    for room in rows:
        cmake = (ROOT / "launcher" / room / "CMakeLists.txt").read_text()
        assert re.search(rf"add_library\(dflash_launch_{room}\b", cmake), f"launcher/{room}: no dflash_launch_{room}"


def test_every_type_the_table_names_exists():
    rows = room_table((ROOT / "docs" / "design.md").read_text())
    missing = [f"{room}/: {t}" for room, types in rows.items() for t in types if not defined(t)]
    assert not missing, f"docs/design.md's room table names types that are not defined: {missing}"


def test_the_check_catches_a_type_that_does_not_exist():
    assert not defined("LiveView") and not defined("RunCommand")
    assert defined("SupervisorCore") and defined("RunRun")
