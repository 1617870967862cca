"""Fixtures of the tasks tests."""

import pytest

from replayssm_eval.accuracy import YAML_DIR


@pytest.fixture(scope="session")
def task_manager():
    """lm-eval's task manager over our YAMLs only; local variants read the bundled fixtures (no data_dir given)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(YAML_DIR), include_defaults=False)
