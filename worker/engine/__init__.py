"""The sandbox engine: a warm zygote that clones one isolated, resource-limited child per
snippet, the supervisor that serves requests and keeps deadlines, and the two isolation
layers (namespaces in ``isolation``; Landlock and seccomp in every child).

``LocalExecutor`` (``executor``) owns one; ``AttachedExecutor`` (``client``) shares it. The
rest of ``codepool.worker`` is the RQ worker host built on it.
"""
