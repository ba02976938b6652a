"""The errors a caller sees."""

from __future__ import annotations

from brook.common.domain.errors import InvalidInput


def test_invalid_input_reads_as_one_line() -> None:
    error = InvalidInput([{"loc": ["jobs", 3, "priority"], "msg": "bad", "type": "t"}])
    assert str(error) == "jobs.3.priority: bad"
    assert str(InvalidInput("unknown task 'x'")) == "unknown task 'x'"


def test_every_public_error_is_in_brook_errors_under_one_root() -> None:
    import inspect

    import brook.errors
    from brook.common.domain import errors, steps

    public = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, errors.BrookError)
    }
    assert {"DuplicateStep", "SignalTimeout", "StepError", "LeaseLost", "Retry"} <= public
    assert set(brook.errors.__all__) == public
    assert all(getattr(brook.errors, name) is getattr(errors, name) for name in public)
    # No other module of the domain defines an error of its own.
    assert not [
        name
        for name, value in vars(steps).items()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == steps.__name__
    ]
