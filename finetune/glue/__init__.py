"""GLUE fine-tuning: task table, readers, metrics, the paper's recipe, reports, `bert-glue`.

    from finetune.glue import finetune, tasks
    result = finetune.run_glue("runs/export", "glue_data", tasks.parse_tasks("rte,mrpc"),
                               finetune.paper_recipe())

Modules: `tasks` (TaskSpec table of the nine tasks), `data` (TSV and Hugging Face readers,
tokenization, batching), `metrics`, `finetune` (training loop, grid over rates and seeds),
`report` (tables, plot, leaderboard zip), `cli` (the `bert-glue` command).
"""
