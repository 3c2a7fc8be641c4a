"""`swebench`: SWE-bench task rows. Running them needs Docker and the task images; without them it stops clearly."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from omrl.envs.base import Action, Reset, StepResult, Task
from omrl.errors import OmrlError

DOCKER_HELP = ("swebench tasks need Docker and its images; {reason}. Install Docker, pull the SWE-bench "
               "instance images (e.g. with the swebench harness), or use the `code` environment for the "
               "offline repair tasks shipped in datasets/code_tasks.")


class SwebenchUnavailable(OmrlError, RuntimeError):
    """Docker or the task's image is missing: the episode cannot run (stored as env_error)."""


@dataclass
class SwebenchOptions:
    """SwebenchEnv's constructor options, as `--env-option KEY=VALUE` gives them (checked by the recipe loader)."""

    docker: str = "docker"
    image_template: str = "swebench/sweb.eval.x86_64.{key}:latest"
    timeout_s: float = 20.0


class SwebenchEnv:
    """SWE-bench Lite/Verified task rows (imported with `omrl tasks import --format swebench`); needs Docker."""

    name = "swebench"
    options_class = SwebenchOptions

    def __init__(self, docker: str = "docker", image_template: str = "swebench/sweb.eval.x86_64.{key}:latest",
                 timeout_s: float = 20.0) -> None:
        self.docker = docker
        self.image_template = image_template
        self.timeout_s = timeout_s

    def reset(self, task: Task) -> Reset:
        self.check_docker()
        image = self.image(task)
        if not self._docker_ok(["image", "inspect", image]):
            raise SwebenchUnavailable(DOCKER_HELP.format(reason=f"image {image} is not present locally"))
        # Running SWE-bench containers (checkout, edits, FAIL_TO_PASS tests) is not implemented yet; say so
        # instead of pretending, so a collect run records env_error with this text.
        raise SwebenchUnavailable(DOCKER_HELP.format(
            reason="Docker and the image are present, but omrl does not run SWE-bench containers yet"))

    def step(self, action: Action) -> StepResult:
        raise SwebenchUnavailable(DOCKER_HELP.format(reason="no episode is running"))

    def close(self) -> None:
        return None

    def image(self, task: Task) -> str:
        """The SWE-bench evaluation image name of a task (instance ids use '_1776_' for '__')."""
        return self.image_template.format(key=task.id.replace("__", "_1776_").lower())

    def check_docker(self) -> None:
        """Raise SwebenchUnavailable unless `docker info` answers."""
        if shutil.which(self.docker) is None:
            raise SwebenchUnavailable(DOCKER_HELP.format(reason=f"the {self.docker!r} command was not found"))
        if not self._docker_ok(["info"]):
            raise SwebenchUnavailable(DOCKER_HELP.format(reason="`docker info` failed (is the daemon running and "
                                                                "may this user use it?)"))

    def _docker_ok(self, args: list[str]) -> bool:
        try:
            result = subprocess.run([self.docker, *args], capture_output=True, timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return result.returncode == 0
