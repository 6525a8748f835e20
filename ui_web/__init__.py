"""Prism's browser dashboard (Streamlit): `prism web` runs `ui_web/dashboard.py`."""
