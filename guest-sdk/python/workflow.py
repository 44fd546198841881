"""The WIT `workflow` interface's resources: componentize-py looks for them in a module named
after the interface. The generator lives in `uncaged_workflow`."""

from uncaged_workflow import Thread  # noqa: F401
