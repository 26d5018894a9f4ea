"""The web dashboard and Prometheus endpoint the daemon serves (FastAPI + uvicorn).

Entry points: ``app.create_app(source, token=..., registry=...)`` over a
``source.DashboardSource`` the daemon implements, and ``server.serve_in_thread(app, host, port)``.
"""
