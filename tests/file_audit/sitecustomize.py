"""Installs the audit of file events (``audit_hook``) in every Python process started with
``DUOLM_AUDIT_DIR`` set: ``tests/test_file_audit.py`` puts this folder first on PYTHONPATH.
``DUOLM_AUDIT_INJECT`` adds one raw event to the command (``inject``), for the break checks."""

import os

if os.environ.get("DUOLM_AUDIT_DIR"):
    import audit_hook

    audit_hook.install()
    if os.environ.get("DUOLM_AUDIT_INJECT"):
        import inject

        inject.inject(os.environ["DUOLM_AUDIT_INJECT"])
