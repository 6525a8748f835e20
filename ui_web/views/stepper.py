"""Page: step through the partitioner's decisions."""

from ui_web import stepper_page

stepper_page.render()
