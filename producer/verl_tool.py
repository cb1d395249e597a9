"""A verl tool on codepool's interpreter contexts: ``CodepoolTool``, for verl's tool
YAML (``class_name: codepool.producer.verl_tool.CodepoolTool``).

A trajectory's code runs in one interpreter context (producer/context.py), so what a
turn defines the next turn sees, on one worker host, each call forked from the last
state in milliseconds. ``execute`` runs the model's ``code`` there and answers with the
reference tool message (``format_tool_content``: stdout, else the traceback, else the
timeout line); ``release`` closes the context; ``calc_reward`` scores the last code
the trajectory ran against the ``ground_truth`` given to ``create`` (verl's
``sandbox_fusion`` format, producer/verl_reward.py), 0.0 without one.

Which calls share a context: verl's ``ToolAgentLoop`` makes an instance per tool
call (``create``, ``execute(..., agent_data=...)``, ``release``); there the context
belongs to the trajectory (its ``AgentData``: kept in ``extra_fields`` and closed when
the trajectory's AgentData is let go), not to the instance. A driver that keeps one
instance for a whole trajectory (``create`` once, ``execute`` per turn, ``release`` at
the end, as verl's SGLang rollout does) gets a context per instance.

A call that times out (or runs out of memory) ends its context, as any context call
does; the trajectory's next call runs in a new one, without the earlier state.

Config (the YAML's ``config``): ``redis_url`` (default ``$REDIS_URL``),
``default_timeout`` (seconds per call, 30), ``memory_limit_mb`` (1024), ``rebuild``
(replay the trajectory's calls on another host if its host is lost, true),
``max_threads`` (blocking Redis waits at once, 256). verl's own ``BaseTool`` and
schema classes are used where verl is installed; a minimal stand-in for them
otherwise, so codepool never needs verl.
"""

from __future__ import annotations

import asyncio
import importlib
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import uuid4

from codepool.common.observation import format_tool_content
from codepool.producer.context import RemoteContext
from codepool.producer.sandbox import RemoteSandbox
from codepool.producer.verl_reward import compute_score

T = TypeVar("T")
# What verl's tool YAML names as ``class_name``: verl imports this module by its name.
MODULE = "codepool.producer.verl_tool"
CLASS_NAME = MODULE + ".CodepoolTool"
CONTEXT_FIELD = "codepool_context"  # where a trajectory's context sits in AgentData
DEFAULT_SCHEMA = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "Run Python code; state is kept across calls. Print what you need to see.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code to run."}},
            "required": ["code"],
        },
    },
}


@dataclass
class ToolResponse:
    """Stands in for verl's ToolResponse where verl is not installed."""

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None


class StandInBaseTool:
    """Stands in for verl's BaseTool where verl is not installed."""

    def __init__(self, config: dict[str, Any], tool_schema: Any) -> None:
        self.config = config
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        function = (
            self.tool_schema["function"]
            if isinstance(self.tool_schema, dict)
            else self.tool_schema.function
        )
        self.name = function["name"] if isinstance(function, dict) else function.name

    def get_openai_tool_schema(self) -> Any:
        return self.tool_schema


def _verl_classes() -> tuple[Any, Any, Any]:
    """verl's BaseTool, OpenAIFunctionToolSchema and ToolResponse, or the stand-ins."""
    try:
        base_tool = importlib.import_module("verl.tools.base_tool")
        schemas = importlib.import_module("verl.tools.schemas")
    except ImportError:
        return StandInBaseTool, None, ToolResponse
    return base_tool.BaseTool, schemas.OpenAIFunctionToolSchema, schemas.ToolResponse


_VERL = _verl_classes()
_BaseTool: Any = _VERL[0]
_ToolSchema: Any = _VERL[1]
_ToolResponse: Any = _VERL[2]


@dataclass
class _Instance:
    ground_truth: Any = None
    context: RemoteContext | None = None  # its own, when no AgentData carries one
    last_code: str | None = None


class CodepoolTool(_BaseTool):  # type: ignore[misc]
    """verl's tool interface (async ``create`` / ``execute`` / ``calc_reward`` /
    ``release``) over codepool contexts; see the module docstring."""

    def __init__(self, config: dict[str, Any], tool_schema: Any = None) -> None:
        if tool_schema is None and _ToolSchema is not None:
            tool_schema = _ToolSchema.model_validate(DEFAULT_SCHEMA)
        super().__init__(config, tool_schema or DEFAULT_SCHEMA)
        self.timeout_s = float(config.get("default_timeout", 30))
        self.rebuild = bool(config.get("rebuild", True))
        self.sandbox = RemoteSandbox(
            config.get("redis_url"),
            timeout=self.timeout_s,
            memory_mb=int(config.get("memory_limit_mb", 1024)),
        )
        self._instances: dict[str, _Instance] = {}
        self._threads = ThreadPoolExecutor(
            int(config.get("max_threads", 256)), thread_name_prefix="codepool-tool"
        )

    async def create(
        self, instance_id: str | None = None, ground_truth: Any = None, **kwargs: Any
    ) -> tuple[str, Any]:
        """A tool instance; ``ground_truth`` (or ``create_kwargs={"ground_truth": ...}``,
        as verl's agent loop passes it) is what ``calc_reward`` scores against."""
        if ground_truth is None:
            ground_truth = (kwargs.get("create_kwargs") or {}).get("ground_truth")
        instance_id = instance_id or str(uuid4())
        self._instances[instance_id] = _Instance(ground_truth=ground_truth)
        return instance_id, _ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[Any, float, dict[str, Any]]:
        """Run ``parameters["code"]`` in the trajectory's context: the tool message, a
        step reward of 0.0, and metrics (status, latency, exec_s, rebuilt)."""
        instance = self._instances.setdefault(instance_id, _Instance())
        code = parameters.get("code", "") if isinstance(parameters, dict) else ""
        if not isinstance(code, str):
            code = str(code)
        timeout_s = parameters.get("timeout", self.timeout_s) if isinstance(parameters, dict) else 0
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
            timeout_s = self.timeout_s
        context = await self._context(instance, kwargs.get("agent_data"))
        result = await self._blocking(lambda: context.run_code(code, timeout_s=float(timeout_s)))
        instance.last_code = code
        metrics = {
            "status": result.status,
            "latency": result.latency,
            "exec_s": result.exec_s,
            "rebuilt": result.rebuilt,
        }
        text = format_tool_content(result, timeout_s=float(timeout_s), markers=self.sandbox.markers)
        return _ToolResponse(text=text), 0.0, metrics

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The last code's score against the instance's ground truth (0.0 without)."""
        instance = self._instances.get(instance_id)
        if instance is None or instance.ground_truth is None or instance.last_code is None:
            return 0.0
        solution = f"```python\n{instance.last_code}\n```"
        truth = instance.ground_truth
        return await self._blocking(
            lambda: compute_score("codepool", solution, truth, sandbox=self.sandbox)
        )

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Forget the instance and close its own context (a trajectory's context ends
        with its AgentData)."""
        instance = self._instances.pop(instance_id, None)
        if instance is not None and instance.context is not None:
            context = instance.context
            await self._blocking(context.close)

    def close(self) -> None:
        """Close every instance's context and the sandbox."""
        for instance in self._instances.values():
            if instance.context is not None:
                instance.context.close()
        self._instances.clear()
        self.sandbox.close()
        self._threads.shutdown(wait=False)

    async def _context(self, instance: _Instance, agent_data: Any) -> RemoteContext:
        """The trajectory's live context (the AgentData's, else the instance's), opened
        when it has none or its last one ended."""
        fields = getattr(agent_data, "extra_fields", None)
        held = fields.get(CONTEXT_FIELD) if isinstance(fields, dict) else instance.context
        if isinstance(held, RemoteContext) and held.ended is None:
            return held
        context = await self._blocking(
            lambda: self.sandbox.context(rebuild=self.rebuild, timeout_s=self.timeout_s)
        )
        if isinstance(fields, dict):
            fields[CONTEXT_FIELD] = context
            try:
                weakref.finalize(agent_data, self._close_later, context)
            except TypeError:  # not weakly referable: the context's idle TTL ends it
                pass
        else:
            instance.context = context
        if isinstance(held, RemoteContext):
            await self._blocking(held.close)
        return context

    def _close_later(self, context: RemoteContext) -> None:
        """Close ``context`` off the thread that let its trajectory go (a GC's)."""
        try:
            self._threads.submit(context.close)
        except RuntimeError:  # the tool was closed meanwhile
            context.close()

    async def _blocking(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, work)


__all__ = ["CodepoolTool"]
