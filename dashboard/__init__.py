"""Streamlit dashboard; reads and writes only through the admin API."""
