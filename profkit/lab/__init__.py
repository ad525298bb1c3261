"""JupyterLab front doors: notebook helpers (:mod:`profkit.lab.notebook`) and the
``%profkit`` / ``%%profkit`` magics (:mod:`profkit.lab.magics`). Like the CLI they only
call experiments/, collectors, the run loader and renderers."""
