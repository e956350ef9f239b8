"""dpone generator: load, validate, plan, render, format, write.

The steps, one module each (build.py runs them in order on one screen): the runtime's
``dpone.packing.pack.load_and_compile`` loads, validates and plans; validate.py adds the DAG-only rules;
dagspec.py decides everything a DAG file says; render.py lays it out through the templates;
format.py applies the pinned black; emit.py is the only step that touches the output folder;
pools.py writes the Airflow pools file.
"""
