"""``resource.Quantity`` for the stand-in: parse a quantity's text to an exact number and write one in the API
server's canonical form.

Follows ``k8s.io/apimachinery/pkg/api/resource/quantity.go`` (the grammar in ``Quantity``'s comment, read by
``parseQuantityString``; ``suffix.go``'s suffixes) and ``CanonicalizeBytes`` (a quantity is written back in its
format's largest suffix that keeps the number whole: ``1000`` DecimalSI is ``1k``, ``1073741824`` BinarySI is
``1Gi``, ``1.5`` is ``1500m``). Used for devices' capacities and counters, request policies and claims' capacity
requests (validation) and for the scheduler stand-in's consumed capacity.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

__all__ = ["Quantity", "QuantityError", "parse"]

_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_TEXT = re.compile(r"^([+-]?)(\d+\.?\d*|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")

#: ``resource.ErrFormatWrong``'s text, as validation reports a bad quantity.
FORMAT_WRONG = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"


class QuantityError(ValueError):
    """Text that is not a quantity (``ErrFormatWrong``)."""


@dataclass(frozen=True)
class Quantity:
    """An exact value and the format its text had (``BinarySI``, ``DecimalSI`` or ``DecimalExponent``)."""

    value: Fraction
    format: str = "DecimalSI"

    def text(self) -> str:
        """The canonical text (``CanonicalizeBytes``) the API server writes this quantity as."""
        return canonical(self.value, self.format)


def parse(text: object) -> Quantity:
    """``ParseQuantity``: the value of a quantity's text; QuantityError naming the text when it is not one."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise QuantityError(f"{text!r}: {FORMAT_WRONG}")
    match = _TEXT.match(str(text).strip())
    if match is None:
        raise QuantityError(f"{text!r}: {FORMAT_WRONG}")
    sign, number, suffix = match.group(1), match.group(2), match.group(3) or ""
    value = Fraction(number)
    fmt = "DecimalSI"
    if suffix in _BINARY:
        value *= 2 ** _BINARY[suffix]
        fmt = "BinarySI"
    elif suffix in _DECIMAL:
        value *= Fraction(10) ** _DECIMAL[suffix]
    else:
        value *= Fraction(10) ** int(suffix[1:])
        fmt = "DecimalExponent"
    return Quantity(-value if sign == "-" else value, fmt)


def canonical(value: Fraction, fmt: str = "DecimalSI") -> str:
    """``CanonicalizeBytes``: whole multiples of 1024 in BinarySI take ``Ki``..``Ei`` (a BinarySI value that is not
    a whole number, or below 1024, is written as DecimalSI); others the largest decimal suffix (or ``eN``) that
    keeps the mantissa whole, down to ``n`` (finer values are rounded up to ``1n``, as ``ParseQuantity`` does)."""
    sign = "-" if value < 0 else ""
    value = abs(value)
    if value == 0:
        return "0"
    if fmt == "BinarySI" and value.denominator == 1 and value >= 1024:
        whole = value.numerator
        exponent = 0
        while whole % 1024 == 0 and exponent < 60:
            whole //= 1024
            exponent += 10
        if exponent:
            suffix = {v: k for k, v in _BINARY.items()}[exponent]
            return f"{sign}{whole}{suffix}"
    nanos = value * 10**9
    scaled = nanos.numerator // nanos.denominator + (1 if nanos.denominator != 1 else 0)
    exponent = -9
    while scaled % 1000 == 0 and exponent < 18:
        scaled //= 1000
        exponent += 3
    if fmt == "DecimalExponent":
        return f"{sign}{scaled}" + (f"e{exponent}" if exponent else "")
    suffix = {v: k for k, v in _DECIMAL.items()}[exponent]
    return f"{sign}{scaled}{suffix}"
