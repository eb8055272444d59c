"""Kubernetes quantities (``resource.Quantity`` text) as exact numbers.

A claim's allocation result on a device with consumable capacity carries
``consumedCapacity``, a map of capacity names to quantities
(``k8s.io/api/resource/v1/types.go``, ``DeviceRequestAllocationResult.ConsumedCapacity``).
Its text follows ``k8s.io/apimachinery/pkg/api/resource/quantity.go`` (the
serialization grammar in ``Quantity``'s comment, scanned by ``parseQuantityString``)::

    <quantity>        ::= <signedNumber><suffix>
    <signedNumber>    ::= <number> | <sign><number>
    <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
    <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>

(``n`` and ``u`` are in ``suffix.go``'s ``newSuffixer``, beside the grammar's
``m .. E``; a decimal exponent is an integer there: ``strconv.ParseInt``.)
:func:`parse_quantity` gives the value as a :class:`~fractions.Fraction`, exact
(``quantity.go`` never uses floating point either); the API server writes
quantities in their canonical form (``CanonicalizeBytes``: ``2``, ``4Gi``,
``1500m``), which this reads exactly. Values finer than ``1n``, which
``ParseQuantity`` rounds up to ``1n``, are kept exact here: nothing devplug reads
is that fine, and rounding would only move a share's amount up, never down.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["QuantityError", "ceil_div", "parse_quantity"]

#: ``suffix.go``, ``newSuffixer``: (base, exponent) of each suffix.
_SUFFIXES: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
_NUMBER = re.compile(r"^([+-]?)([0-9]*)(?:\.([0-9]*))?(.*)$")
_EXPONENT = re.compile(r"^[eE]([+-]?[0-9]+)$")
#: The largest decimal exponent computed (``suffix.go`` takes any ``int32``; a value past 10^1000 exceeds every
#: capacity a device publishes, and 10^(2^31) would cost this process its memory to compute).
_MAX_EXPONENT = 1000


class QuantityError(ValueError):
    """Text that is no Kubernetes quantity; the message names the text and why."""


def parse_quantity(text: str) -> Fraction:
    """The exact value of a quantity's text (``"2"`` -> 2, ``"1.5Gi"`` -> 1610612736, ``"500m"`` -> 1/2).

    Raises :class:`QuantityError` for text ``ParseQuantity`` refuses (empty, no digits, an unknown suffix)."""
    if not isinstance(text, str) or not text:
        raise QuantityError(f"{text!r} is not a quantity: it is empty")
    found = _NUMBER.match(text)
    if found is None:  # the pattern matches every string; kept for the type checker
        raise QuantityError(f"{text!r} is not a quantity")
    sign, whole, fraction, suffix = found.groups()
    if not whole and not fraction:
        raise QuantityError(f"{text!r} is not a quantity: it has no digits (quantity.go: <number>)")
    # Fraction reads decimal text exactly ("1.5" -> 3/2, "1e-3" -> 1/1000): no float anywhere
    value = Fraction(f"{whole or '0'}.{fraction or '0'}")
    if suffix in _SUFFIXES:
        value *= _SUFFIXES[suffix]
    else:
        exponent = _EXPONENT.match(suffix)
        if exponent is None:
            raise QuantityError(
                f"{text!r} is not a quantity: unknown suffix {suffix!r} (quantity.go: Ki..Ei, n u m k M G T P E, "
                "or e<integer>)"
            )
        power = int(exponent.group(1))
        if abs(power) > _MAX_EXPONENT:
            raise QuantityError(f"{text!r}: an exponent beyond +-{_MAX_EXPONENT} is refused (no capacity is so large)")
        value *= Fraction(f"1e{power}")
    return -value if sign == "-" else value


def ceil_div(amount: Fraction, step: int) -> int:
    """The smallest whole number of ``step``-sized units that holds ``amount`` (``amount`` > 0, ``step`` >= 1)."""
    units = amount / step
    whole = units.numerator // units.denominator
    return whole if whole == units else whole + 1
