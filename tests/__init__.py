"""The test suite; its folders mirror the project's packages (pipelines, model, training, finetune,
flows) and its deployment files (infra)."""
