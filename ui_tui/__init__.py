"""Prism's terminal dashboard (Textual): watch the runtime live, step through a plan.

    from app.dashboard import DashboardModel
    from app.live import LiveRuntime
    from ui_tui import PrismApp
    PrismApp(DashboardModel(LiveRuntime())).run()
"""

from ui_tui.app import PrismApp

__all__ = ["PrismApp"]
