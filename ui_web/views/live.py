"""Page: the live view of the running network."""

from ui_web import live_page

live_page.render()
