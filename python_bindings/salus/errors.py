"""Salus errors: exceptions with fields, never strings to parse.

Every Salus failure raised in Python is a :class:`Error`. Bad arguments are also ``ValueError``
(:class:`InvalidArgument`) or ``TypeError`` (raised by the argument checks themselves).
"""

from __future__ import annotations

from typing import Any, Optional


class Error(Exception):
    """A Salus failure. ``message`` repeats in words what the fields say."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        for name, value in fields.items():
            setattr(self, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # The fields travel with the error (pickle, Ray, multiprocessing), not only the message.
        return (_rebuild, (type(self), self.message, dict(self.__dict__)))


class InvalidArgument(Error, ValueError):
    """A malformed request: an unknown name, a size of 0, an unknown pointer, a double free."""


class NotSupported(Error, NotImplementedError):
    """A feature this build, backend or machine does not provide."""


class SettingIgnored(UserWarning):
    """A setting the process asked for that Salus overrides: ``setting`` names it, ``value`` is
    what was asked, ``reason`` says why it has no effect."""

    def __init__(self, message: str, *, setting: str, value: str, reason: str) -> None:
        super().__init__(message)
        self.setting = setting
        self.value = value
        self.reason = reason


class JobCancelled(Error):
    """The job was cancelled: its wait ended, its later calls fail."""


class UnknownJob(Error, LookupError):
    """A job id that was never registered here or has been released."""

    job: int


class DeviceError(Error, RuntimeError):
    """A driver (or simulator) call failed: ``call`` names it, ``status`` is the driver's error."""

    call: str
    status: str
    status_code: int


class OutOfMemory(Error, MemoryError):
    """A well-formed request that a budget or the device could not meet.

    Fields: ``job`` (id, 0 when unattributed) and ``job_name``; ``device``; ``requested`` bytes;
    ``job_in_use`` and ``job_limit`` (0 unless a job budget said no); ``device_in_use`` and
    ``device_limit``; ``reason`` (which budget said no); ``waited``: seconds the allocation waited
    for other jobs' iterations to end before it failed (0.0 when it failed at once; the
    runtime's ``allocation_wait`` when that limit ended the wait).
    """

    job: int
    job_name: str
    device: int
    requested: int
    job_in_use: int
    job_limit: int
    device_in_use: int
    device_limit: int
    reason: str
    waited: float


def _rebuild(cls: type, message: str, fields: dict[str, Any]) -> Error:
    fields = {k: v for k, v in fields.items() if k != "message"}
    return cls(message, **fields)


__all__ = [
    "Error",
    "InvalidArgument",
    "NotSupported",
    "JobCancelled",
    "SettingIgnored",
    "UnknownJob",
    "DeviceError",
    "OutOfMemory",
]

