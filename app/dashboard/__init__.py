"""The dashboards' view model: what the TUI and the web UI show, computed once.

    model = DashboardModel(LiveRuntime())      # or Recording("run.jsonl"), any RuntimeSource
    view = model.poll()                         # a DashboardView: rows, series, drawing
    model.faster(); model.repartition(mode="memory"); stepper = model.stepper()
"""

from app.dashboard.model import DashboardModel, DashboardView, Totals
from app.dashboard.rows import DeviceRow, PartitionRow
from app.dashboard.series import Series
from app.dashboard.source import (
    BundleInfo,
    LoadSetting,
    LoadState,
    PartitionSteps,
    RuntimeSource,
    ScheduleRow,
    Status,
)
from app.dashboard.stepper import LegendEntry, Stepper, StepView
from app.dashboard.training import StepFigures, TimelineBar, TrainingTracker, TrainingView

__all__ = ["BundleInfo", "DashboardModel", "DashboardView", "DeviceRow",
           "LegendEntry", "LoadSetting", "LoadState", "PartitionRow", "PartitionSteps",
           "RuntimeSource", "ScheduleRow", "Series", "Status", "StepFigures", "StepView",
           "Stepper", "TimelineBar", "Totals", "TrainingTracker", "TrainingView"]
