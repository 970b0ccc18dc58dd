"""Token counts as users write them: ``4096``, ``64K``, ``1.5k``, ``1M``; one parser for every command
and file (plan, simulate, advise, train, run matrices, SLURM runs), binary suffixes as Megatron users
mean them (64K = 65536).

>>> parse_tokens("64K"), parse_tokens("1M"), parse_tokens("1.5k"), parse_tokens(4096), parse_tokens("32k")
(65536, 1048576, 1536, 4096, 32768)
>>> parse_tokens("1Q")
Traceback (most recent call last):
...
megatron_zeppelin.spec.token_counts.TokenCountError: '1Q' is not a token count (e.g. 4096, 64K, 1M)
"""

from __future__ import annotations

import argparse

from megatron_zeppelin.errors import ZeppelinError

_SUFFIX = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


class TokenCountError(ZeppelinError):
    pass


def parse_tokens(text) -> int:
    """A whole, non-negative token count with an optional binary suffix K, M or G."""
    s = str(text).strip().lower()
    mult = _SUFFIX.get(s[-1:], 1)
    num = s[:-1] if s[-1:] in _SUFFIX else s
    try:
        v = float(num) * mult
    except ValueError:
        raise TokenCountError(f"'{text}' is not a token count (e.g. 4096, 64K, 1M)") from None
    if not (0 <= v < float("inf")) or v != int(v):  # also NaN / inf
        raise TokenCountError(f"'{text}' is not a whole, non-negative token count")
    return int(v)


def token_count(text) -> int:
    """``parse_tokens`` as an argparse ``type=`` (a usage error naming the flag)."""
    try:
        return parse_tokens(text)
    except TokenCountError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
