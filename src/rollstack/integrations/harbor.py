"""Harbor environment provider: Harbor tasks' agents and verifiers in rollstack environments.

    harbor run -p TASK_DIR -a oracle -e rollstack.integrations.harbor:RollstackEnvironment \\
        --ek store=oci:/var/lib/rollstack/store

Harbor (harbor-framework/harbor, needs Python >= 3.12) selects a third-party provider by import
path; `make setup` installs it with this package's SDK into `.venv-harbor` (docs/harbor.md).

`start` makes the task's image a layer group in the node's store once per image definition
(`rollstack.integrations.taskimage`: `docker_image` imported, or `environment/Dockerfile` built
by buildah), then creates one environment over it with the task's cpus, memory, workdir and env.
`exec` runs `bash -c` (`sh -c` where the image has no bash) through the node's exec, as the
requested user (`su`) when it is not root; a command past `timeout_sec` is killed and raises
`RuntimeError`, as Harbor's Docker provider does. Files move through the node's files API;
directories as one tar each way (extracted on the host with tarfile's `data` filter). `stop`
destroys the environment (rollstack environments are disposable; `delete=False` changes nothing).

Network: Harbor's `public` policy is the plan's `outbound` (egress through the node, nothing
inbound); `no-network` is `none`; allowlists are not declared, so Harbor refuses such tasks
before start instead of running them unrestricted.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import uuid
from pathlib import Path, PurePosixPath
from typing import Any

try:
    from harbor.environments.base import BaseEnvironment, ExecResult
    from harbor.environments.capabilities import EnvironmentCapabilities
    from harbor.environments.options import EnvironmentOptions
except ImportError as exc:  # pragma: no cover - exercised only without harbor
    raise ImportError("rollstack.integrations.harbor needs harbor (Python >= 3.12): see docs/harbor.md") from exc
from pydantic import Field

from rollstack.errors import GroupNotFound, RollstackError, TemplateNotFound
from rollstack.integrations.connect import async_client
from rollstack.integrations.taskimage import ImageBuilder, TaskImage
from rollstack.integrations.transfer import pack_dir, unpack_into, write_bytes

_ROOT_NAMES = ("", "root", "0")
_TMP = "/tmp"


class RollstackOptions(EnvironmentOptions):
    """`--ek KEY=VALUE` options of the rollstack provider."""

    node: str | None = Field(default=None, description="node agent URL (default $ROLLSTACK_NODE)")
    token: str | None = Field(default=None, description="bearer token (default $ROLLSTACK_TOKEN or the node's token file)",
                              exclude=True, repr=False)
    store: str | None = Field(default=None, description="the node's store, where task images are imported "
                                                        "(default $ROLLSTACK_STORE)")
    cli: str | None = Field(default=None, description="the rollstack CLI that imports images (default $ROLLSTACK_CLI, "
                                                      "else `rollstack` on PATH)")
    cache_dir: str | None = Field(default=None, description="image cache (default ~/.cache/rollstack/harbor)")
    plan: str | None = Field(default=None, description="a published plan NAME:TAG to run instead of the task's image")


class RollstackEnvironment(BaseEnvironment):
    """One Harbor environment = one rollstack environment."""

    options_model = RollstackOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        opts = self.options if isinstance(self.options, RollstackOptions) else RollstackOptions()
        self._opts = opts
        self._client: Any = None
        self._owned = False
        self._env: Any = None
        self._shell = "bash"
        self._image_user = ""
        """The image's USER: commands run as it when Harbor names no user (as Docker's do)."""

    @staticmethod
    def type() -> str:
        return "rollstack"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True)

    def _validate_definition(self) -> None:
        if getattr(self, "_opts", None) is not None and self._opts.plan:
            return
        if (Path(self.environment_dir) / "docker-compose.yaml").is_file():
            raise ValueError("rollstack runs one container per environment: docker-compose tasks are not supported")
        if not self.task_env_config.docker_image and not (Path(self.environment_dir) / "Dockerfile").is_file():
            raise FileNotFoundError(f"{self.environment_dir}/Dockerfile not found and the task names no docker_image")

    # -- lifecycle ------------------------------------------------------------------------------

    def _builder(self) -> ImageBuilder:
        store = self._opts.store or os.environ.get("ROLLSTACK_STORE")
        if not store:
            raise ValueError("the rollstack provider needs the node's store: --ek store=... or $ROLLSTACK_STORE")
        cache = Path(self._opts.cache_dir or os.environ.get("ROLLSTACK_HARBOR_CACHE")
                     or Path.home() / ".cache" / "rollstack" / "harbor")
        return ImageBuilder(store=store, cache_dir=cache,
                            cli=self._opts.cli or os.environ.get("ROLLSTACK_CLI") or "rollstack")

    def _plan(self, image: TaskImage) -> dict[str, Any]:
        cfg = self.task_env_config
        mode = getattr(self.network_policy.network_mode, "value", self.network_policy.network_mode)
        return image.plan(self.environment_name, workdir=cfg.workdir, env=dict(cfg.env or {}),
                          cpus=self._effective_cpus, memory_mb=self._effective_memory_mb,
                          network="none" if mode == "no-network" else "outbound")

    async def start(self, force_build: bool) -> None:
        self._client, self._owned = async_client(None, self._opts.node, self._opts.token)
        if self._opts.plan:
            self._env = await self._client.create(self._opts.plan)
        else:
            builder = self._builder()
            args = (Path(self.environment_dir), self.environment_name, self.task_env_config.docker_image)
            image = await asyncio.to_thread(builder.ensure, *args, force_build=force_build)
            self._image_user = image.user
            try:
                self._env = await self._client.create(self._plan(image))
            except (GroupNotFound, TemplateNotFound):  # the store lost the group since it was cached
                builder.forget(Path(self.environment_dir), self.task_env_config.docker_image)
                image = await asyncio.to_thread(builder.ensure, *args, force_build=True)
                self._env = await self._client.create(self._plan(image))
        probe = await self._env.exec(["sh", "-c", "command -v bash >/dev/null"])
        self._shell = "bash" if probe.exit_code == 0 else "sh"
        await self.ensure_dirs(self._mount_targets(writable_only=True))
        await self._upload_environment_dir_after_start()

    async def stop(self, delete: bool) -> None:
        env, self._env = self._env, None
        try:
            if env is not None:
                await env.destroy()
        finally:
            if self._owned and self._client is not None:
                await self._client.aclose()
            self._client = None

    # -- commands -------------------------------------------------------------------------------

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        resolved = self._resolve_user(user)
        argv = self._argv(command, self._image_user or None if resolved is None else resolved)
        merged = self._merge_env(env)
        r = await self._live().exec(argv, cwd=cwd or self.task_env_config.workdir or None,
                                    env=merged or None, timeout=timeout_sec)
        if r.timed_out:
            raise RuntimeError(f"command timed out after {timeout_sec} seconds")
        return ExecResult(stdout=r.stdout, stderr=r.stderr, return_code=r.exit_code)

    def _argv(self, command: str, user: str | int | None) -> list[str]:
        """`SHELL -c command`, through `su` for a user other than root (a uid, or `user:group`
        as Docker's USER allows, becomes its name from /etc/passwd)."""
        name = "" if user is None else str(user).split(":", 1)[0]
        if name in _ROOT_NAMES:
            return [self._shell, "-c", command]
        shell = f"/bin/{self._shell}"
        if name.isdigit():  # su takes names: look the uid up inside the environment
            lookup = f"u=$(awk -F: '$3=={name} {{print $1; exit}}' /etc/passwd) && [ -n \"$u\" ] || " \
                     f"{{ echo 'no user with uid {name} in /etc/passwd' >&2; exit 126; }}; "
            return ["sh", "-c", lookup + f'exec su -s {shell} "$u" -c "$0"', command]
        return ["su", "-s", shell, name, "-c", command]

    def _live(self) -> Any:
        if self._env is None:
            raise RuntimeError("the rollstack environment is not started (or already stopped)")
        return self._env

    async def _root(self, script: str) -> None:
        r = await self._live().exec(["sh", "-c", script])
        if r.exit_code != 0:
            raise RuntimeError(f"{script!r} failed ({r.exit_code}): {r.stderr.strip()[-500:]}")

    # -- files ----------------------------------------------------------------------------------

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        data = await asyncio.to_thread(Path(source_path).read_bytes)
        await self._root(f"mkdir -p {shlex.quote(str(PurePosixPath(target_path).parent))}")
        await self._live().write_file(target_path, data)
        mode = Path(source_path).stat().st_mode & 0o777
        await self._root(f"chmod {mode:o} {shlex.quote(target_path)}")

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        blob = await asyncio.to_thread(pack_dir, Path(source_dir))
        remote = f"{_TMP}/rs-upload-{uuid.uuid4().hex}.tar"
        await self._live().write_file(remote, blob)
        q, t = shlex.quote(remote), shlex.quote(target_dir)
        await self._root(f"mkdir -p {t} && tar -xf {q} -C {t}; rc=$?; rm -f {q}; exit $rc")

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        data = await self._live().read_file(source_path)
        target = Path(target_path)
        await asyncio.to_thread(write_bytes, target, data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        remote = f"{_TMP}/rs-download-{uuid.uuid4().hex}.tar"
        q = shlex.quote(remote)
        try:
            await self._root(f"tar -cf {q} -C {shlex.quote(source_dir)} .")
            blob = await self._live().read_file(remote)
        finally:
            try:
                await self._root(f"rm -f {q}")
            except (RollstackError, RuntimeError):
                pass  # the environment ended meanwhile: nothing is left to clean
        await asyncio.to_thread(unpack_into, blob, Path(target_dir))
