"""Transitional: the field flags and rules now live in ``relax.config.fields``; the names the
algorithm configuration still uses are re-exported here until it moves there as well."""

from relax.config.fields import (  # noqa: F401
    FIELD_DEFAULT,
    FINITE,
    INTEGER,
    NON_NEGATIVE,
    NON_NEGATIVE_INT,
    POSITIVE,
    POSITIVE_INT,
    REWARD_KEY,
    UNIT_INTERVAL,
    Flag,
    Range,
    flag,
    flag_default,
    flag_name,
    flag_of,
    option_strings,
)

finite_float, positive_float, non_negative_float, unit_interval = FINITE, POSITIVE, NON_NEGATIVE, UNIT_INTERVAL
positive_int, reward_key_name = POSITIVE_INT, REWARD_KEY
