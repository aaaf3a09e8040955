"""The Django app: nothing but its label; the command and the operations need no setup."""

from __future__ import annotations

from django.apps import AppConfig


class MoverConfig(AppConfig):
    name = "mover.contrib.django"
    # Not the default ("django", the package's last part), which reads as Django's own.
    label = "mover"
    verbose_name = "mover"
