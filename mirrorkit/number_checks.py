"""The checks of a number argument: a positive integer, a non-negative one, a positive number.

One wording for every public function and command that takes a count, a size
or a duration: ``NAME must be a positive integer; got VALUE`` (and a fix, where
one helps). A bool is never a number here (``True`` is not a batch size), and
NumPy scalars are numbers like Python's.

Example:
```python
from mirrorkit import number_checks

steps = number_checks.positive_int(100, "steps")
try:
    number_checks.positive_number(0, "timeout_s", unit="seconds")
except ValueError as err:
    print(err)  # timeout_s must be a positive number of seconds; got 0
```
"""

from __future__ import annotations

import math
import numbers


def _fail(name: str, what: str, value: object, fix: str) -> ValueError:
    return ValueError(f"{name} must be {what}; got {value!r}" + (f". {fix}" if fix else ""))


def positive_int(
    value: object, name: str, *, fix: str = "", or_none: bool = False, what: str = ""
) -> int | None:
    """Returns `value` as an int when it is an integer >= 1; else raises, naming it.

    Args:
        value: what the caller passed.
        name: how the message names the argument (``"global_batch_size"``, ``"--batch"``).
        fix: a sentence the message ends with, saying what to give.
        or_none: None is accepted (and returned).
        what: the message's words for what is wanted; default "a positive integer".

    Returns:
        The value as an int, or None.

    Raises:
        ValueError: ``NAME must be a positive integer; got VALUE``.

    Example:
    ```python
    from mirrorkit.number_checks import positive_int

    assert positive_int(32, "global_batch_size") == 32
    ```
    """
    if value is None and or_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        what = what or "a positive integer" + (" or None" if or_none else "")
        raise _fail(name, what, value, fix)
    return int(value)


def non_negative_int(value: object, name: str, *, fix: str = "") -> int:
    """Returns `value` as an int when it is an integer >= 0; else raises, naming it.

    Args:
        value: what the caller passed.
        name: how the message names the argument.
        fix: a sentence the message ends with, saying what to give.

    Returns:
        The value as an int.

    Raises:
        ValueError: ``NAME must be a non-negative integer; got VALUE``.

    Example:
    ```python
    from mirrorkit.number_checks import non_negative_int

    assert non_negative_int(0, "warmup_steps") == 0
    ```
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise _fail(name, "a non-negative integer", value, fix)
    return int(value)


def positive_number(
    value: object,
    name: str,
    *,
    unit: str = "",
    fix: str = "",
    or_none: bool = False,
    what: str = "",
) -> float | None:
    """Returns `value` as a float when it is a finite number > 0; else raises, naming it.

    Args:
        value: what the caller passed.
        name: how the message names the argument.
        unit: what the number counts (``"seconds"``), said in the message.
        fix: a sentence the message ends with, saying what to give.
        or_none: None is accepted (and returned).
        what: the message's words for what is wanted; default "a positive number [of UNIT]".

    Returns:
        The value as a float, or None.

    Raises:
        ValueError: ``NAME must be a positive number of UNIT; got VALUE``.

    Example:
    ```python
    from mirrorkit.number_checks import positive_number

    assert positive_number(2.5, "timeout_s", unit="seconds") == 2.5
    ```
    """
    if value is None and or_none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or not value > 0
    ):
        raise _fail(name, what or "a positive number" + (f" of {unit}" if unit else ""), value, fix)
    return float(value)
