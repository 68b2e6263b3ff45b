"""runtime/kiln_safetensors.h: the C++ reader sees what safetensors wrote, and refuses bad files by name.

tests/cpp/safetensors_dump.cpp is compiled once per session and run on files written here; its output is
compared with what Python reads from the same file.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from contract.config import PROJECT_ROOT

pytestmark = pytest.mark.skipif(
    shutil.which("g++") is None, reason="g++ is not on PATH: cannot compile the C++ safetensors reader"
)

DRIVER_SOURCE = PROJECT_ROOT / "tests" / "cpp" / "safetensors_dump.cpp"
FLAGS = ["-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-I", str(PROJECT_ROOT / "runtime")]
# Note: a sanitizer's report must not read as the driver's own "exit 1, bad file", so it gets its own code.
SANITIZER_EXIT = 86
SANITIZER_ENV = {
    # detect_leaks=0: LeakSanitizer cannot run under ptrace, as in some sandboxes; the reader owns memory
    # only through RAII members, which ASan still checks for use after free.
    "ASAN_OPTIONS": f"exitcode={SANITIZER_EXIT}:detect_leaks=0",
    "UBSAN_OPTIONS": f"exitcode={SANITIZER_EXIT}:halt_on_error=1:print_stacktrace=1",
}

DTYPE_NAMES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}


@dataclass(frozen=True)
class Drivers:
    plain: Path  # built with exactly the flags generated code uses
    checked: Path  # the same, under ASan and UBSan where the toolchain has them; else `plain`


@pytest.fixture(scope="session")
def drivers(tmp_path_factory: pytest.TempPathFactory) -> Drivers:
    """Both builds at once: the sanitized one is the slow one (~5 s), and it overlaps the plain one."""
    out = tmp_path_factory.mktemp("safetensors_dump")
    plain, checked = out / "dump", out / "dump_checked"
    sanitize = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
    jobs = [
        subprocess.Popen(["g++", *FLAGS, *extra, str(DRIVER_SOURCE), "-o", str(exe)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for exe, extra in [(plain, []), (checked, sanitize)]
    ]
    logs = [job.communicate(timeout=120)[0] for job in jobs]
    if jobs[0].returncode != 0:
        raise AssertionError(f"safetensors_dump.cpp does not compile:\n{logs[0]}")
    return Drivers(plain, checked if jobs[1].returncode == 0 else plain)


def run(exe: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # errors="replace": messages quote names as written, and a hostile file's names need not be UTF-8
    return subprocess.run([str(exe), *args], capture_output=True, text=True, errors="replace", timeout=60,
                          check=False, env=dict(os.environ, **SANITIZER_ENV))


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFF_FFFF_FFFF_FFFF
    return h


def dump_line(name: str, dtype: str, shape: list[int], data: bytes) -> str:
    return f"{name} {dtype} [{','.join(map(str, shape))}] {len(data)} {fnv1a(data):016x}"


def python_view(path: Path) -> list[str]:
    """What safetensors' own reader finds in `path`, in the driver's format (sorted by name)."""
    lines = []
    with safe_open(str(path), framework="pt") as f:
        for name in sorted(f.keys()):
            t = f.get_tensor(name)
            data = t.reshape(-1).view(torch.uint8).numpy().tobytes()
            lines.append(dump_line(name, DTYPE_NAMES[t.dtype], list(t.shape), data))
    return lines


def pack(header: str | bytes, data: bytes = b"", length: int | None = None) -> bytes:
    """A safetensors file from its parts; `length` overrides the header length field."""
    raw = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def write(tmp_path: Path, contents: bytes, name: str = "w.safetensors") -> Path:
    path = tmp_path / name
    path.write_bytes(contents)
    return path


def sample_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "fc1.weight": torch.randn(16, 8, generator=g),
        "fc1.bias": torch.randn(5, generator=g, dtype=torch.float64),
        "half": torch.randn(3, 3, generator=g).half(),
        "brain": torch.randn(7, generator=g).bfloat16(),
        "i64": torch.arange(-5, 5),
        "i32": torch.tensor([-(2**31), 2**31 - 1], dtype=torch.int32),
        "i16": torch.tensor([[-300, 7], [1, 2]], dtype=torch.int16),
        "i8": torch.tensor([-128, 127, 0], dtype=torch.int8),
        "u8": torch.randint(0, 256, (2, 3, 1), generator=g, dtype=torch.uint8),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "empty3": torch.zeros(2, 0, 3, dtype=torch.int8),
        'odd"name\\x': torch.ones(2),
        "ünïcode": torch.ones(1, dtype=torch.int16),
    }


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    path = tmp_path / "sample.safetensors"
    save_file(sample_tensors(), str(path), metadata={"format": "pt", "quote": 'a "b" \\ ü'})
    return path


def test_reads_what_safetensors_wrote(drivers: Drivers, sample: Path) -> None:
    proc = run(drivers.plain, str(sample))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == python_view(sample)
    assert len(proc.stdout.splitlines()) == len(sample_tensors())


def test_unaligned_data_and_escaped_names(drivers: Drivers, tmp_path: Path) -> None:
    """A 3-byte tensor first puts the next at offset 3; names written with \\u escapes, pairs included."""
    header = json.dumps({
        "a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
        "caf\u00e9\U0001f600": {"dtype": "F32", "shape": [2], "data_offsets": [3, 11]},
        "__metadata__": {"k": "v"},
    }, ensure_ascii=True)
    assert "\\ud83d\\ude00" in header
    data = bytes([1, 2, 3]) + struct.pack("<2f", 1.5, -2.0)
    path = write(tmp_path, pack(header, data))
    proc = run(drivers.checked, str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        dump_line("a", "U8", [3], data[:3]),
        dump_line("caf\u00e9\U0001f600", "F32", [2], data[3:]),
    ]


@pytest.mark.parametrize(
    ("name", "dtype", "dims", "problem"),
    [
        ("fc1.weight", "F32", "16,8", None),
        ("scalar", "F32", "", None),
        ("fc1.weight", "F32", "32,8", "'fc1.weight' has shape [16, 8], the model expects [32, 8]"),
        ("fc1.weight", "F16", "16,8", "'fc1.weight' has dtype F32, the model expects F16"),
        ("scalar", "F32", "1", "'scalar' has shape [], the model expects [1]"),
        ("fc2.weight", "F32", "4", "no tensor 'fc2.weight' (the model expects F32 [4])"),
    ],
)
def test_check_entry(drivers: Drivers, sample: Path, name: str, dtype: str, dims: str,
                     problem: str | None) -> None:
    proc = run(drivers.plain, str(sample), "--expect", name, dtype, dims)
    if problem is None:
        assert (proc.returncode, proc.stdout) == (0, "ok\n")
    else:
        assert proc.returncode == 1
        assert proc.stdout == f"error: weights file '{sample}': {problem}\n"


GOOD = '"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}'
DATA = struct.pack("<2f", 1.0, 2.0)

# (id, header, marker, problem): the error is at the file byte where `marker` starts in the header (at its
# end when None) and its message contains `problem`.
MALFORMED = [
    ("empty_header", "", None, "expected '{', found end of header"),
    ("not_an_object", "[]", "[", "expected '{', found '['"),
    ("trailing_comma", '{"__metadata__": {"k": "v",}}', "}}", "expected a string, found '}'"),
    ("unterminated_string", '{"w', '"w', "unterminated string"),
    ("missing_colon", '{"w" 1}', "1}", "expected ':', found '1'"),
    ("fraction", GOOD.replace("[2]", "[2.0]").join("{}"), "2.0", "found a fraction or exponent"),
    ("exponent", GOOD.replace("[2]", "[2e0]").join("{}"), "2e0", "found a fraction or exponent"),
    ("negative", GOOD.replace("[2]", "[-2]").join("{}"), "-2", "expected a non-negative integer, found '-'"),
    ("leading_zero", GOOD.replace("[2]", "[02]").join("{}"), "02", "integer with a leading zero"),
    ("huge_integer", GOOD.replace("[2]", "[9223372036854775808]").join("{}"), "92233", "integer too large"),
    ("literal", GOOD.replace("[2]", "true").join("{}"), "true", "expected '[', found 't'"),
    ("bad_escape", '{"w\\q": 1}', "\\q", "invalid escape"),
    ("bad_hex", '{"w\\u12g4": 1}', "\\u", "invalid hex digit in \\u escape"),
    ("lone_low_surrogate", '{"\\udc00": 1}', "\\u", "lone low surrogate"),
    ("unpaired_high_surrogate", '{"\\ud83dx": 1}', "\\u", "high surrogate without a low one"),
    ("control_character", '{"w\x01": 1}', "\x01", "control character byte 0x01 in a string"),
    ("trailing_data", "{" + GOOD + "} x", "x", "unexpected 'x' after the header object"),
    ("duplicate_tensor", "{" + GOOD + ", " + GOOD.replace('"w":', '"w" :') + "}", '"w" :',
     "duplicate key 'w'"),
    ("unknown_field", GOOD.replace('"shape"', '"scale": "x", "shape"').join("{}"), '"scale"',
     "unknown field 'scale' in tensor 'w'"),
    ("missing_field", '{"w": {"dtype": "F32", "data_offsets": [0, 8]}}', '{"dtype"',
     "tensor 'w' needs \"dtype\", \"shape\" and \"data_offsets\""),
    ("offsets_arity", GOOD.replace("[0, 8]", "[8]").join("{}"), '{"dtype"',
     "tensor 'w' has \"data_offsets\" that are not [begin, end]"),
    ("metadata_not_string", '{"__metadata__": {"k": 1}}', "1}}", "expected a string, found '1'"),
]


@pytest.mark.parametrize(("header", "marker", "problem"), [case[1:] for case in MALFORMED],
                         ids=[case[0] for case in MALFORMED])
def test_malformed_json_names_the_byte(drivers: Drivers, tmp_path: Path, header: str, marker: str | None,
                                       problem: str) -> None:
    path = write(tmp_path, pack(header, DATA))
    at = 8 + (len(header) if marker is None else header.index(marker))
    proc = run(drivers.checked, str(path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"error: weights file '{path}': malformed JSON header at byte {at}: ")
    assert problem in proc.stdout


def tensor(dtype: str = "F32", shape: str = "[2]", offsets: str = "[0, 8]") -> str:
    return f'{{"w": {{"dtype": "{dtype}", "shape": {shape}, "data_offsets": {offsets}}}}}'


# (id, file contents, problem)
BAD_FILES = [
    ("empty_file", b"", "too short (0 bytes) to hold the 8-byte header length"),
    ("too_short", b"\x02\x00\x00", "too short (3 bytes) to hold the 8-byte header length"),
    ("header_too_long", pack("{}", DATA, length=1000),
     "header length 1000 runs past the end of the file (18 bytes)"),
    ("header_length_wraps", pack("{}", DATA, length=2**64 - 1),
     f"header length {2**64 - 1} runs past the end of the file (18 bytes)"),
    ("offsets_past_data", pack(tensor(offsets="[0, 16]"), DATA),
     "tensor 'w' has data_offsets [0, 16] outside the data (8 bytes)"),
    ("offsets_backwards", pack(tensor(offsets="[8, 0]"), DATA),
     "tensor 'w' has data_offsets [8, 0], which run backwards"),
    ("offsets_huge", pack(tensor(offsets="[9223372036854775807, 9223372036854775807]"), DATA),
     "outside the data (8 bytes)"),
    ("nbytes_mismatch", pack(tensor(shape="[3]"), DATA),
     "tensor 'w' has data_offsets [0, 8] (8 bytes), but F32 [3] needs 12"),
    ("numel_overflow", pack(tensor(shape="[4611686018427387904, 4]"), DATA),
     "tensor 'w' has shape [4611686018427387904, 4], too large to address"),
    ("unknown_dtype", pack(tensor(dtype="F8_E4M3"), DATA), "tensor 'w' has unknown dtype 'F8_E4M3'"),
    ("control_bytes_in_name", pack(tensor(dtype="F8").replace('"w"', '"a\\n\\u001bb"'), DATA),
     "tensor 'a\\x0a\\x1bb' has unknown dtype 'F8'"),
]


@pytest.mark.parametrize(("contents", "problem"), [case[1:] for case in BAD_FILES],
                         ids=[case[0] for case in BAD_FILES])
def test_bad_file_names_the_problem(drivers: Drivers, tmp_path: Path, contents: bytes, problem: str) -> None:
    path = write(tmp_path, contents)
    proc = run(drivers.checked, str(path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"error: weights file '{path}': ")
    assert problem in proc.stdout


def test_missing_file_and_directory(drivers: Drivers, tmp_path: Path) -> None:
    missing = run(drivers.plain, str(tmp_path / "nope.safetensors"))
    assert missing.returncode == 1
    assert missing.stdout == (
        f"error: weights file '{tmp_path / 'nope.safetensors'}': cannot open: No such file or directory\n"
    )
    folder = run(drivers.plain, str(tmp_path))
    assert folder.stdout == f"error: weights file '{tmp_path}': not a regular file\n"


def test_truncated_checkpoint(drivers: Drivers, sample: Path, tmp_path: Path) -> None:
    contents = sample.read_bytes()
    path = write(tmp_path, contents[:-10], "cut.safetensors")
    proc = run(drivers.plain, str(path))
    assert proc.returncode == 1
    assert "outside the data" in proc.stdout


HOSTILE_BYTES = b'"\\{}[],:9u\x00\xff'


def guarded(header: bytes) -> bytes:
    """A data-less file whose header ends exactly at a page boundary, left-padded with JSON whitespace.

    Note: the sanitizers cannot see past the end of an mmap, but the page after a page-aligned mapping is
    not mapped, so a parser that reads one byte past the header faults and the driver dies by a signal.
    """
    return pack(header.rjust(mmap.PAGESIZE - 8, b" "))


def mutations(header: bytes) -> list[bytes]:
    """Every prefix of the header, and a few hostile bytes written over each of its bytes, all guarded."""
    out = [guarded(header[:n]) for n in range(len(header))]
    for i in range(len(header)):
        out += [guarded(header[:i] + bytes([b]) + header[i + 1:]) for b in HOSTILE_BYTES]
    return out


def length_mutations(contents: bytes) -> list[bytes]:
    """Every header length up to past the file, and every prefix of the file."""
    body = contents[8:]
    return [struct.pack("<Q", n) + body for n in range(len(body) + 8)] + [
        contents[:n] for n in range(len(contents))
    ]


def open_each(drivers: Drivers, tmp_path: Path, files: list[bytes]) -> list[str]:
    paths = [str(write(tmp_path, contents, f"m{i}")) for i, contents in enumerate(files)]
    proc = run(drivers.checked, "--each", *paths)
    assert proc.returncode == 0, f"the driver died ({proc.returncode}):\n{proc.stderr[-3000:]}"
    lines = proc.stdout.rstrip("\n").split("\n")  # the reader escapes control bytes in names
    assert len(lines) == len(paths)
    assert all(line.startswith(("ok ", "error: weights file ")) for line in lines)
    return lines


def hostile_header(tensors: dict[str, tuple[str, list[int], list[int]]]) -> bytes:
    meta: dict[str, object] = {"__metadata__": {"k": '\\"\u00e9\U0001f600'}}
    entries = {name: {"dtype": d, "shape": s, "data_offsets": o} for name, (d, s, o) in tensors.items()}
    return json.dumps(meta | entries, ensure_ascii=True, separators=(",", ":")).encode()


def test_hostile_headers_never_crash(drivers: Drivers, tmp_path: Path) -> None:
    """Under ASan/UBSan where available: each mutant opens or fails with a message, nothing else."""
    header = hostile_header({"a": ("BF16", [2, 0], [0, 0]), "b": ("I8", [0], [0, 0])})
    lines = open_each(drivers, tmp_path, [guarded(header), *mutations(header)])
    assert lines[0] == "ok 2"
    assert sum(line.startswith("error: ") for line in lines) > len(lines) // 2


def test_hostile_lengths_never_crash(drivers: Drivers, tmp_path: Path) -> None:
    header = hostile_header({"a": ("BF16", [2, 1], [0, 4]), "b": ("I8", [], [4, 5])})
    contents = pack(header, bytes(range(5)))
    lines = open_each(drivers, tmp_path, length_mutations(contents))
    assert lines[len(header)] == "ok 2"  # the true header length
    prefixes = lines[len(contents):]
    assert all(line.startswith("error: ") for line in prefixes)  # a file cut anywhere is refused
