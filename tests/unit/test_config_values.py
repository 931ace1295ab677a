"""The settings handover: what ``stonemq serve`` validates with pydantic arrives in the serving
process as the same values, and dynamic broker configs are checked there as pydantic would."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from stonemq.config import Settings, field_specs, load_settings
from stonemq.config_values import (
    FieldSpec,
    SettingsValues,
    check_value,
    decode_handover,
    encode_handover,
)


def _handover(settings: Settings) -> SettingsValues:
    return decode_handover(
        encode_handover(field_specs(), dict(settings), settings.model_fields_set)
    )


def test_every_field_has_a_spec_with_the_models_default() -> None:
    specs = {spec.name: spec for spec in field_specs()}
    assert list(specs) == list(Settings.model_fields)
    assert specs["num_partitions"] == FieldSpec(
        "num_partitions", "int", gt=0, default=1, description=None
    )
    assert specs["journal_partitions"].le == 1024
    assert specs["data_dir"].kind == "path" and specs["data_dir"].default == "data"
    assert specs["journal_dir"].nullable
    assert specs["journal_flush_policy"].choices == ("always", "interval", "never")
    assert specs["fetch_zero_copy"].kind == "bool"


def test_handover_gives_the_same_values_and_views(tmp_path: Path) -> None:
    settings = load_settings(
        listen="127.0.0.1:19092",
        data_dir=tmp_path,
        queue_dir=tmp_path / "q",
    )
    values = _handover(settings)
    for name in Settings.model_fields:
        assert getattr(values, name) == getattr(settings, name), name
        assert type(getattr(values, name)) is type(getattr(settings, name)), name
    assert values.model_fields_set == settings.model_fields_set
    assert (
        "queue_dir" in values.model_fields_set and "num_partitions" not in values.model_fields_set
    )
    assert values.journal_path == settings.journal_path == tmp_path / "journal"
    assert values.queue_path == tmp_path / "q"
    assert values.listen_address == settings.listen_address == ("127.0.0.1", 19092)
    assert values.advertised_for("PLAINTEXT") == ("127.0.0.1", 19092)
    with pytest.raises(AttributeError):
        values.num_partitions = 3  # type: ignore[misc]


def test_handover_refuses_a_document_that_does_not_match_its_fields() -> None:
    good = encode_handover(field_specs(), dict(load_settings()), ())
    bad = good.replace(b'"num_partitions": 1', b'"num_partitions": -4')
    assert bad != good
    with pytest.raises(ValueError, match="greater than 0"):
        decode_handover(bad)
    missing = good.replace(b'"num_partitions": 1, ', b"")
    assert missing != good
    with pytest.raises(ValueError, match="do not match"):
        decode_handover(missing)


_SPECS = {spec.name: spec for spec in field_specs()}
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from([0, 1, -1, -2, 4, 14, 1024, 1025, 2**63 - 1, 2**63]),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.sampled_from(["interval", "never", "force", "CreateTime", "x"]),
)


@given(name=st.sampled_from(sorted(_SPECS)), value=_VALUES)
def test_check_value_accepts_and_refuses_what_pydantic_does(name: str, value: Any) -> None:
    """For the values a dynamic broker config parses to (bool, int, str), the serving process's
    check agrees with the model's own validation of that field."""
    info = Settings.model_fields[name]
    annotation: Any = info.annotation  # with its bounds; Annotated needs at least one
    if info.metadata:
        annotation = Annotated[(annotation, *info.metadata)]
    adapter: TypeAdapter[Any] = TypeAdapter(annotation)
    if isinstance(value, float) and _SPECS[name].kind != "float":
        return  # parse_value never gives a float for a non-float config
    try:
        adapter.validate_python(value, strict=True)
        pydantic_ok = True
    except ValidationError:
        pydantic_ok = False
    if _SPECS[name].kind == "path" and isinstance(value, str):
        pydantic_ok = True  # strict mode wants a Path object; a config value is a string
    try:
        check_value(_SPECS[name], value)
        ours_ok = True
    except ValueError:
        ours_ok = False
    assert ours_ok == pydantic_ok, (name, value)
