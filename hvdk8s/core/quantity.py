"""Kubernetes resource quantities (`4`, `500m`, `16Gi`, `1.5e3`), parsed in one place for every caller.

The grammar is k8s.io/apimachinery's resource.Quantity:

    <quantity> ::= <sign>? <number> <suffix>?       <sign> ::= + | -
    <number>   ::= <digits> | <digits>. | <digits>.<digits> | .<digits>
    <suffix>   ::= Ki | Mi | Gi | Ti | Pi | Ei                 (binary SI)
                 | n | u | m | k | M | G | T | P | E          (decimal SI)
                 | e<sign>?<digits> | E<sign>?<digits>        (decimal exponent; an integer, as the parser
                                                               requires: its OpenAPI pattern is looser)

Values are exact `Decimal`s. Inputs are bounded (length, exponent, magnitude) so that a hostile or
mistyped string costs microseconds, never a huge integer.
"""
from __future__ import annotations

import decimal
import re
from decimal import Decimal
from typing import Annotated, Any, Union

from pydantic import BeforeValidator

MAX_LENGTH = 64
MAX_EXPONENT = 99  # far beyond any real amount; bounds the work before the magnitude check
MAX_VALUE = Decimal(2**63 - 1)  # Kubernetes cannot represent more (it caps); we refuse instead
EXAMPLES = "examples: 4, 500m, 16Gi"

_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
# The whole grammar as one anchored pattern, also usable as a JSON-schema `pattern`.
PATTERN = rf"^[+-]?{_NUMBER}(?:[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
_PARTS = re.compile(rf"([+-]?{_NUMBER})(?:([KMGTPE]i)|([numkMGTPE])|[eE]([+-]?[0-9]+))?")

_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}  # powers of two
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}  # powers of ten
# Enough digits that every in-bounds value is computed exactly (64 digits times 2**60).
_EXACT = decimal.Context(prec=200, Emax=10**4, Emin=-10**4, traps=[decimal.Inexact, decimal.Overflow])


def parse_quantity(text: Union[str, int, float]) -> Decimal:
    """The exact value of a quantity; ValueError naming the text when it is not one."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError(f"{text!r} is not a Kubernetes quantity ({EXAMPLES})")
    s = str(text)
    if len(s) > MAX_LENGTH:
        raise ValueError(f"{s[:16]!r}... ({len(s)} characters) is not a Kubernetes quantity "
                         f"(at most {MAX_LENGTH} characters; {EXAMPLES})")
    m = _PARTS.fullmatch(s)
    if not m:
        raise ValueError(f"{s!r} is not a Kubernetes quantity ({EXAMPLES})")
    number, binary, dec, exponent = m.groups()
    value = Decimal(number)  # Decimal reads '5.' and '.5' as Kubernetes does
    if exponent is not None and abs(int(exponent)) > MAX_EXPONENT:
        raise ValueError(f"{s!r} is out of range (exponent beyond ±{MAX_EXPONENT})")
    if binary:
        value = _EXACT.multiply(value, Decimal(2 ** _BINARY[binary]))
    else:
        value = _EXACT.scaleb(value, _DECIMAL[dec] if dec else int(exponent or 0))
    if abs(value) > MAX_VALUE:
        raise ValueError(f"{s!r} is out of range (Kubernetes quantities stop at 2^63-1)")
    return value


def cpu_cores(quantity: Union[str, int, float, Decimal]) -> float:
    """Cores in a CPU quantity: '500m' -> 0.5, '2k' -> 2000.0."""
    return float(quantity if isinstance(quantity, Decimal) else parse_quantity(quantity))


def parse_bytes(text: Union[str, int, float]) -> int:
    """A whole, non-negative number of bytes: '16Gi' -> 17179869184, '1.5Ki' -> 1536."""
    value = parse_quantity(text)
    s = str(text)
    if value < 0:
        raise ValueError(f"{s!r} is negative; a size is 0 or more bytes")
    if value != value.to_integral_value():
        hint = f" (did you mean {s[:-1]}M? 'm' is milli, 'M' mega)" if s.endswith("m") else ""
        raise ValueError(f"{s!r} is {value.normalize():f} bytes, not a whole number of bytes{hint}")
    return int(value)


def _resource(value: Any) -> str:
    if parse_quantity(value) < 0:  # also refuses booleans, lists, None: one message naming the field
        raise ValueError(f"{str(value)!r} is negative; a resource amount is 0 or more")
    return str(value)


def _bytes(value: Any) -> str:
    parse_bytes(value)
    return str(value)


# Field types for job files: a str, int or float (as YAML gives it), validated, then kept as the string
# Kubernetes will see. Validated before pydantic's own type check so that a wrong type gets this message.
Quantity = Annotated[str, BeforeValidator(_resource)]
# Also a whole number of bytes (e.g. a cache quota handed to `hvdk8s cache sync --quota`).
ByteQuantity = Annotated[str, BeforeValidator(_bytes)]
