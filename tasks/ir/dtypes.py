"""The element types the IR can hold, by short names that read well in the text form."""

from __future__ import annotations

import enum


class DType(enum.Enum):
    BOOL = "b8"
    U8 = "u8"
    I8 = "i8"
    I16 = "i16"
    I32 = "i32"
    I64 = "i64"
    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"
    F64 = "f64"
    # Note: complex tensors only pass through: aten fallbacks make and take them (fft, say),
    # the runtime holds them; no kiln kernel computes on one (lowering leaves such ops to torch).
    C64 = "c64"
    C128 = "c128"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        return self in FLOATS

    @property
    def is_int(self) -> bool:
        return self in INTS

    @property
    def is_complex(self) -> bool:
        return self in (DType.C64, DType.C128)

    @property
    def is_half(self) -> bool:
        """fp16 or bf16: stored in 2 bytes, computed in fp32."""
        return self in (DType.F16, DType.BF16)

    @property
    def compute(self) -> DType:
        """The type arithmetic runs in: fp16/bf16 storage computes in fp32."""
        return DType.F32 if self.is_half else self


FLOATS = frozenset({DType.F16, DType.BF16, DType.F32, DType.F64})
INTS = frozenset({DType.U8, DType.I8, DType.I16, DType.I32, DType.I64})
_ITEMSIZE = {
    DType.BOOL: 1, DType.U8: 1, DType.I8: 1, DType.I16: 2, DType.I32: 4, DType.I64: 8,
    DType.F16: 2, DType.BF16: 2, DType.F32: 4, DType.F64: 8, DType.C64: 8, DType.C128: 16,
}
# torch's dtype names, so the IR itself never imports torch.
TORCH_NAMES = {
    DType.BOOL: "bool", DType.U8: "uint8", DType.I8: "int8", DType.I16: "int16",
    DType.I32: "int32", DType.I64: "int64", DType.F16: "float16", DType.BF16: "bfloat16",
    DType.F32: "float32", DType.F64: "float64", DType.C64: "complex64", DType.C128: "complex128",
}
BY_TORCH_NAME = {v: k for k, v in TORCH_NAMES.items()}
# c10::ScalarType's numbering, which a schema's ScalarType default is written in (torch's schema
# types say only "int"): triu_indices' dtype=long is 4.
SCALAR_TYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "complex32",
                "complex64", "complex128", "bool", "qint8", "quint8", "qint32", "bfloat16")
