"""Prism's browser dashboard: `streamlit run ui_web/dashboard.py` (or `prism web`).

The entry point: page set-up, the shared runtime, the sidebar controls, the outcome of
the last Apply, then the page the user picked (live view or partition stepper).
"""

from __future__ import annotations

import streamlit as st

from ui_web import sidebar
from ui_web.cached import shared_live

st.set_page_config(page_title="Prism", page_icon=":material/hub:", layout="wide",
                   initial_sidebar_state="expanded")
page = st.navigation([
    st.Page("views/live.py", title="Live", icon=":material/monitoring:", default=True),
    st.Page("views/stepper.py", title="Partition stepper", icon=":material/account_tree:"),
])
st.html("<style>[data-testid='stMainBlockContainer'] {padding-top: 2.5rem;}</style>")
shared = shared_live()
sidebar.render(shared)
sidebar.show_result()
page.run()
