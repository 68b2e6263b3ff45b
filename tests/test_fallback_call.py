"""Fallback nodes as generated C++ (tasks/gen_cpp/fallback.py), run for real through torch's
stable dispatcher and compared with the IR interpreter's eager call.

Every case is one function of a single test program (one g++ run): it makes the node's input
buffers with aoti_torch_empty_strided, fills them with the bytes Python chose, takes the node's
strided views, runs the generated block and prints each output's bytes in hex. Run with
`leaks`, the program instead repeats every case and prints how much the heap grew.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from cache.hashing import canonical_json
from tasks.gen_cpp.fallback import fallback_call
from tasks.ir.dtypes import BY_TORCH_NAME, TORCH_NAMES, DType
from tasks.ir.interpret import empty, run_node, torch_dtype
from tasks.ir.nodes import Buffer, Fallback, View, contiguous_strides

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on PATH")

RUNTIME = Path(__file__).resolve().parents[1] / "runtime"
LEAK_ROUNDS = 1000
# Note: torch 2.10 to 2.13 leak the std::string of every `str` argument in the dispatcher's
# StableIValue -> IValue conversion (pytorch/pytorch#191340): ~50 bytes a call, not ours.
TORCH_LEAKS = {"div_floor": 80}
F32, F64, I64 = DType.F32, DType.F64, DType.I64


@dataclass(frozen=True)
class Case:
    name: str
    node: Fallback
    buffers: dict[str, torch.Tensor]  # every buffer the node's views read, with its data


def buf(name: str, shape: tuple[int, ...], dtype: DType = F32,
        stride: tuple[int, ...] | None = None) -> Buffer:
    return Buffer(name, shape, stride or contiguous_strides(shape), dtype, "cpu")


def whole(b: Buffer) -> View:
    return View(b.name, b.shape, b.stride, 0, b.dtype)


def filled(b: Buffer, seed: int, values: list[float] | None = None) -> torch.Tensor:
    """b's tensor: `values` in storage order, else seeded random data (small ints for ints)."""
    t = empty(b)
    storage = t.as_strided((b.nbytes // b.dtype.itemsize,), (1,))
    gen = torch.Generator().manual_seed(seed)
    if values is not None:
        storage.copy_(torch.tensor(values))
    elif b.dtype.is_float:
        storage.copy_(torch.randn(storage.shape, generator=gen))
    else:
        storage.copy_(torch.randint(0, 4, storage.shape, generator=gen))
    return t


def node(target: str, outs: list[Buffer], views: list[View], **kwargs: Any) -> Fallback:
    spec = {"args": [], "kwargs": kwargs}
    return Fallback(target, tuple(outs), tuple(views), canonical_json(spec).decode(), "test")


def case(name: str, n: Fallback, data: dict[str, torch.Tensor]) -> Case:
    return Case(name, n, {v.buffer: data[v.buffer] for v in n.inputs})


def fl(value: float) -> dict[str, str]:
    return {"float": value.hex()}


def t(n: int) -> dict[str, int]:
    return {"input": n}


def _exported_cases() -> list[Case]:
    """Fallback nodes as kiln's lowering writes them, from a real exported function."""
    from tasks.ir.oracle import export, program_data
    from tasks.lower.program import lower_program

    def fn(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        v, i = torch.sort(y, dim=-1, descending=True, stable=True)
        tv, ti = torch.topk(y, 3, dim=0, largest=False)
        # Note: kiln lowers cumsum up to 4096 long (tasks/lower/scans.py SCAN_LIMIT): w's is longer
        return (*torch.kthvalue(x, 2, 1), torch.cumsum(w, 1, dtype=torch.float64), v, i, tv, ti,
                torch.median(z.t()[1:], 0)[0], torch.nn.functional.pdist(x, p=1.5))

    inputs = [torch.randn(4, 5), torch.randn(6, 7), torch.randn(5, 5), torch.randn(2, 4097)]
    graph = lower_program(program_data(export(fn, inputs)), {})
    buffers = graph.buffers()
    cases: list[Case] = []
    for n in graph.nodes:
        if isinstance(n, Fallback):
            data = {v.buffer: filled(buffers[v.buffer], len(cases)) for v in n.inputs}
            cases.append(Case(f"export_{len(cases)}_{n.target.split('.')[1]}", n, data))
    found = sorted({c.node.target for c in cases})
    want = ["aten._pdist_forward.default", "aten.cumsum.default", "aten.kthvalue.default",
            "aten.median.dim", "aten.sort.stable", "aten.topk.default"]
    assert found == want, f"the exported function's fallbacks are now {found}: pick ops kiln does not compile"
    assert any(v.stride != contiguous_strides(v.shape) or v.offset for c in cases for v in c.node.inputs)
    return cases


def _direct_cases() -> list[Case]:
    """Argument kinds the exported function does not reach, as Fallback nodes made by hand."""
    x, y, i = buf("x", (4, 5)), buf("y", (5, 4)), buf("i", (3,), I64)
    ints = buf("n", (4, 5), DType.I32)
    specials = [math.nan, math.inf, -math.inf, 1.5, -0.0, 2.0]
    odd = buf("s", (2, 3))
    image = buf("img", (1, 2, 3, 4))
    data = {"x": filled(x, 1), "y": filled(y, 2), "i": filled(i, 0, [4, 0, 2]),
            "n": filled(ints, 3), "s": filled(odd, 0, specials), "img": filled(image, 4)}
    xt = View("y", (4, 5), (1, 4), 0, F32)  # y transposed: a strided view
    return [
        # int lists (SymInt[1], int[1]) into an output with transposed strides
        case("roll", node("aten.roll.default", [buf("o", (4, 5), F32, (1, 4))], [whole(x)],
                          self=t(0), shifts=[1, -2], dims=[0, 1]), data),
        # float? both present (inf among them) and None
        case("nan_to_num", node("aten.nan_to_num.default", [buf("o", (2, 3))], [whole(odd)],
                                self=t(0), nan=fl(0.25), posinf=None, neginf=fl(-math.inf)), data),
        # Tensor?[] holding None and a tensor
        case("index", node("aten.index.Tensor", [buf("o", (4, 3))], [whole(x), whole(i)],
                           self=t(0), indices=[None, t(1)]), data),
        # Tensor[] of a contiguous and a strided view; dim left out: the schema's default (0)
        case("cat", node("aten.cat.default", [buf("o", (8, 5))], [whole(x), xt], tensors=[t(0), t(1)]), data),
        # str?
        case("div_floor", node("aten.div.Tensor_mode", [buf("o", (4, 5))], [whole(x), xt],
                               self=t(0), other=t(1), rounding_mode="floor"), data),
        # Tensor[] returned
        case("unbind", node("aten.unbind.int", [buf(f"o{k}", (5,)) for k in range(4)], [whole(x)],
                            self=t(0), dim=0), data),
        # ScalarType?, Layout?, Device?, bool?, MemoryFormat?
        case("to_copy", node("aten._to_copy.default", [buf("o", (4, 5), DType.I32)], [whole(x)],
                             self=t(0), dtype={"dtype": "i32"}, layout={"enum": "torch.strided"},
                             device={"device": "cpu"}, pin_memory=False, non_blocking=False,
                             memory_format={"enum": "torch.contiguous_format"}), data),
        # an int input and no dtype: an i64 result
        case("cumsum_int", node("aten.cumsum.default", [buf("o", (4, 5), I64)], [whole(ints)],
                                self=t(0), dim=-1, dtype=None), data),
        # SymInt[]? None and float[]? present
        case("upsample", node("aten.upsample_bilinear2d.vec", [buf("o", (1, 2, 6, 6))], [whole(image)],
                              input=t(0), output_size=None, align_corners=False,
                              scale_factors=[fl(2.0), fl(1.5)]), data),
    ]


def _failing_case() -> Case:
    y = buf("y", (6, 7))
    bad = node("aten.topk.default", [buf("v", (9, 7)), buf("j", (9, 7), I64)], [whole(y)],
               self=t(0), k=9, dim=0, largest=True, sorted=True)
    return Case("topk_too_many", bad, {"y": filled(y, 5)})


# -- the test program ------------------------------------------------------------------------

PRELUDE = r"""
#include "kiln_fallback.h"

#include <malloc.h>
#include <cstdio>
#include <string>

namespace {

struct Held {  // a test-owned handle, deleted at scope exit
  AtenTensorHandle h = nullptr;
  ~Held() { if (h != nullptr) aoti_torch_delete_tensor_object(h); }
};

void ok(AOTITorchError err, const char* what) {
  if (err != AOTI_TORCH_SUCCESS) throw std::runtime_error(std::string("test setup: ") + what);
}

void make(Held& out, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> stride,
          int32_t dtype, const char* hex) {
  ok(aoti_torch_empty_strided(static_cast<int64_t>(shape.size()), shape.begin(), stride.begin(), dtype,
                              aoti_torch_device_type_cpu(), 0, &out.h), "empty_strided");
  void* data = nullptr;
  ok(aoti_torch_get_data_ptr(out.h, &data), "get_data_ptr");
  auto* bytes = static_cast<unsigned char*>(data);
  for (size_t i = 0; hex[2 * i] != 0; ++i) {
    bytes[i] = static_cast<unsigned char>(std::stoi(std::string(hex + 2 * i, 2), nullptr, 16));
  }
}

void view(Held& out, const Held& base, std::initializer_list<int64_t> shape,
          std::initializer_list<int64_t> stride, int64_t offset) {
  ok(aoti_torch__reinterpret_tensor(base.h, static_cast<int64_t>(shape.size()), shape.begin(), stride.begin(),
                                    offset, &out.h), "reinterpret_tensor");
}

void dump(const char* name, size_t index, const Held& t, size_t nbytes) {
  void* data = nullptr;
  ok(aoti_torch_get_data_ptr(t.h, &data), "get_data_ptr");
  std::printf("OUT %s %zu ", name, index);
  for (size_t i = 0; i < nbytes; ++i) std::printf("%02x", static_cast<unsigned char*>(data)[i]);
  std::printf("\n");
}

size_t heap_bytes() {  // in use: small chunks and mmapped ones
#if __GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33)
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
#else
  const struct mallinfo m = mallinfo();
  return static_cast<size_t>(static_cast<unsigned>(m.uordblks)) + static_cast<unsigned>(m.hblkhd);
#endif
}

}  // namespace
"""


def _dims(values: tuple[int, ...]) -> str:
    return "{" + ", ".join(str(v) for v in values) + "}"


def _shim_dtype(dtype: DType) -> str:
    return f"aoti_torch_dtype_{TORCH_NAMES[dtype]}()"


def _case_function(index: int, case: Case) -> list[str]:
    n = case.node
    lines = [f"void case_{index}(bool report) {{", f'  const char* name = "{case.name}";']
    for name, tensor in case.buffers.items():
        storage = tensor.as_strided((tensor.untyped_storage().nbytes() // tensor.element_size(),), (1,))
        hex_data = storage.contiguous().view(torch.uint8).numpy().tobytes().hex()
        dtype = _shim_dtype(BY_TORCH_NAME[str(tensor.dtype).removeprefix("torch.")])
        lines.append(f"  Held b_{name};")
        shape, stride = _dims(tuple(tensor.shape)), _dims(tuple(tensor.stride()))
        lines.append(f'  make(b_{name}, {shape}, {stride}, {dtype}, "{hex_data}");')
    for k, v in enumerate(n.inputs):
        lines.append(f"  Held in{k};")
        lines.append(f"  view(in{k}, b_{v.buffer}, {_dims(v.shape)}, {_dims(v.stride)}, {v.offset});")
    for k, b in enumerate(n.outs):
        lines.append(f"  Held out{k};")
        lines.append(f'  make(out{k}, {_dims(b.shape)}, {_dims(b.stride)}, {_shim_dtype(b.dtype)}, "");')
    try_block = fallback_call(n, [f"in{k}.h" for k in range(len(n.inputs))],
                              [f"out{k}.h" for k in range(len(n.outs))])
    lines += ["  try {", *("    " + line for line in try_block), "  } catch (const std::runtime_error& e) {",
              "    std::string what = e.what();",
              "    for (char& c : what) if (c == '\\n') c = ' ';",
              '    if (report) std::printf("ERR %s %s\\n", name, what.c_str());',
              "    return;", "  }"]
    lines += [f"  if (report) dump(name, {k}, out{k}, {b.nbytes});" for k, b in enumerate(n.outs)]
    return [*lines, "}"]


def program_source(cases: list[Case]) -> str:
    lines = [PRELUDE]
    for k, case in enumerate(cases):
        lines += _case_function(k, case)
    lines += ["int main(int argc, char** argv) {",
              '  if (argc < 2 || std::string(argv[1]) != "leaks") {',
              *(f"    case_{k}(true);" for k in range(len(cases))),
              "    return 0;",
              "  }"]
    for k, case in enumerate(cases):
        # Note: warm up first: the dispatcher's caches, torch's allocator, OpenMP's threads.
        lines += [f"  for (int i = 0; i < 20; ++i) case_{k}(false);",
                  "  {",
                  "    const size_t before = heap_bytes();",
                  f"    for (int i = 0; i < {LEAK_ROUNDS}; ++i) case_{k}(false);",
                  f'    std::printf("LEAK {case.name} %zd\\n", static_cast<ssize_t>(heap_bytes() - before));',
                  "  }"]
    return "\n".join([*lines, "  return 0;", "}"]) + "\n"


def torch_dirs() -> tuple[Path, Path]:
    spec = importlib.util.find_spec("torch")
    assert spec is not None
    assert spec.origin is not None
    root = Path(spec.origin).parent
    return root / "include", root / "lib"


def build(source: str, folder: Path) -> Path:
    include, lib = torch_dirs()
    src, exe = folder / "fallbacks.cpp", folder / "fallbacks"
    src.write_text(source)
    cmd = ["g++", "-std=c++17", "-O1", f"-I{RUNTIME}", f"-I{include}", str(src), "-o", str(exe),
           f"-L{lib}", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{lib}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"building the test program failed:\n{proc.stderr[-6000:]}"
    return exe


@dataclass
class Results:
    outs: dict[tuple[str, int], bytes]
    errors: dict[str, str]
    leak_output: str


@functools.cache
def all_cases() -> list[Case]:
    return [*_exported_cases(), *_direct_cases(), _failing_case()]


@pytest.fixture(scope="module")
def results() -> Results:
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(program_source(all_cases()), Path(tmp))
        run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, check=True)
        leaks = subprocess.run([str(exe), "leaks"], capture_output=True, text=True, timeout=120, check=True)
    outs: dict[tuple[str, int], bytes] = {}
    errors: dict[str, str] = {}
    for line in run.stdout.splitlines():
        kind, name, rest = line.split(" ", 2)
        if kind == "OUT":
            index, hex_data = rest.split(" ")
            outs[name, int(index)] = bytes.fromhex(hex_data)
        elif kind == "ERR":
            errors[name] = rest
    return Results(outs, errors, leaks.stdout)


def expected(case: Case) -> list[torch.Tensor]:
    env = dict(case.buffers)
    run_node(case.node, env)
    return [env[b.name] for b in case.node.outs]


def tensor_from(data: bytes, b: Buffer) -> torch.Tensor:
    flat = torch.frombuffer(bytearray(data), dtype=torch_dtype(b.dtype))
    return flat.as_strided(b.shape, b.stride)


def case_names() -> list[str]:
    return [c.name for c in all_cases() if c.name != "topk_too_many"]


@pytest.mark.parametrize("name", case_names())
def test_fallback_matches_eager(results: Results, name: str) -> None:
    case = next(c for c in all_cases() if c.name == name)
    assert name not in results.errors, results.errors.get(name)
    for k, (b, want) in enumerate(zip(case.node.outs, expected(case), strict=True)):
        got = tensor_from(results.outs[name, k], b)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, equal_nan=True,
                                   msg=functools.partial(_labelled, f"{name} output {k}"))


def _labelled(label: str, message: str) -> str:
    return f"{label}: {message}"


def test_failure_names_the_op(results: Results) -> None:
    assert results.errors["topk_too_many"].startswith("aten.topk.default failed: ")


def test_no_leaks(results: Results) -> None:
    """Every case, the failing one too, 1,000 times: a handle, box or list leaked per call is
    at least 32 bytes a call (glibc's smallest chunk); what is left is allocator noise."""
    growth = {name: int(n) for _, name, n in (line.split() for line in results.leak_output.splitlines())}
    assert sorted(growth) == sorted(c.name for c in all_cases())
    for name, grew in growth.items():
        per_call = TORCH_LEAKS.get(name, 16)
        assert grew < per_call * LEAK_ROUNDS, f"{name}: the heap grew {grew} bytes over {LEAK_ROUNDS} calls"


def test_generated_block() -> None:
    n = node("aten.cumsum.default", [buf("o", (4, 5), F64)], [whole(buf("x", (4, 5)))],
             self=t(0), dim=1, dtype={"dtype": "f64"})
    assert fallback_call(n, ["a"], ["b"]) == [
        "{",
        '  kiln::FallbackCall fb("aten::cumsum", "", "aten.cumsum.default");',
        "  fb.push_tensor(a);  // self",
        "  fb.push_int(1);  // dim",
        "  fb.push_dtype(aoti_torch_dtype_float64());  // dtype",
        "  fb.wrap_optional();",
        "  fb.run({kiln::Ret::kTensor});",
        "  fb.copy_tensor(0, b);",
        "}",
    ]


def test_generated_lists_and_optionals() -> None:
    x, i = whole(buf("x", (4, 5))), whole(buf("i", (3,), I64))
    index = node("aten.index.Tensor", [buf("o", (4, 3))], [x, i], self=t(0), indices=[None, t(1)])
    assert fallback_call(index, ["a", "b"], ["c"])[2:8] == [
        "  fb.push_tensor(a);  // self",
        "  fb.begin_list();  // indices",
        "  fb.push_none();",
        "  fb.push_tensor(b);",
        "  fb.wrap_optional();",
        "  fb.end_list();",
    ]
    up = node("aten.upsample_bilinear2d.vec", [buf("o", (1, 2, 6, 6))], [whole(buf("m", (1, 2, 3, 4)))],
              input=t(0), output_size=None, align_corners=False, scale_factors=[fl(2.0), fl(math.inf)])
    assert fallback_call(up, ["a"], ["b"])[3:9] == [
        "  fb.push_none();  // output_size",
        "  fb.push_bool(false);  // align_corners",
        "  fb.begin_list();  // scale_factors",
        "  fb.push_double(0x1.0000000000000p+1 /* 2.0 */);",
        "  fb.push_double(std::numeric_limits<double>::infinity());",
        "  fb.end_list();",
    ]


def test_an_op_taking_a_scalar_goes_through_kilns_boxed_call() -> None:
    x = whole(buf("x", (4, 5)))
    renorm = node("aten.renorm.default", [buf("o", (4, 5))], [x], self=t(0), p=2, dim=0, maxnorm=fl(1.5))
    block = fallback_call(renorm, ["a"], ["b"])
    assert block[1].startswith('  kiln::BoxedCall fb("aten::renorm", "", ')
    assert block[3:6] == ["  fb.push_scalar_int(2);  // p", "  fb.push_int(0);  // dim",
                          "  fb.push_scalar_double(0x1.8000000000000p+0 /* 1.5 */);  // maxnorm"]


def test_scalars_through_kilns_boxed_call_match_eager(tmp_path: Path) -> None:
    """histc and segment_reduce take Scalars and have no overload taking tensors instead."""
    from kiln import compile as kiln_compile

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (torch.histc(x, bins=5, min=-1, max=1),
                    torch.segment_reduce(x, "max", lengths=lengths, initial=0.25))

    args = (torch.randn(8), torch.tensor([3, 0, 5]))
    compiled = kiln_compile(Model(), args, target="cpu", out=tmp_path / "b", cache_dir=tmp_path / "c")
    fallbacks = json.loads((tmp_path / "b" / "report.json").read_text())["fallbacks"]
    assert {"aten.histc.default", "aten.segment_reduce.default"} <= set(fallbacks)
    for got, want in zip(compiled(*args), Model()(*args), strict=True):
        torch.testing.assert_close(got, want)


def test_refusals_name_the_op_and_argument() -> None:
    x = whole(buf("x", (4, 5)))
    missing = node("aten.cumsum.default", [buf("o", (4, 5))], [x], self=t(0))
    with pytest.raises(ValueError, match=r"aten\.cumsum\.default: argument 'dim' has no value"):
        fallback_call(missing, ["a"], ["b"])
    inplace = node("aten.relu_.default", [buf("o", (4, 5))], [x], self=t(0))
    with pytest.raises(ValueError, match=r"aten\.relu_\.default: writes its argument 'self'"):
        fallback_call(inplace, ["a"], ["b"])
    unknown = node("aten.cumsum.default", [buf("o", (4, 5))], [x], self=t(0), dim=0, axis=1)
    with pytest.raises(ValueError, match=r"\['axis'\] are not in torch's schema"):
        fallback_call(unknown, ["a"], ["b"])


def test_complex_tensors_pass_between_torchs_ops(tmp_path: Path) -> None:
    """kiln computes no complex value: every op that takes or makes one is an aten fallback, and
    complex tensors live in kiln's buffers and come out as outputs."""
    from kiln import compile as kiln_compile

    class Spectral(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            f = torch.fft.fft(x)
            return (torch.fft.irfft(x), torch.fft.rfft(x).abs(), torch.view_as_real(f) * 2, f, f * 2,
                    f.conj(), torch.fft.hfft2(x[:4]), f[:0] * 2)

    x = torch.randn(8, 6)
    compiled = kiln_compile(Spectral(), (x,), target="cpu", out=tmp_path / "b", cache_dir=tmp_path / "c")
    for got, want in zip(compiled(x), Spectral()(x), strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
