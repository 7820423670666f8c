"""Model preparation: a pretrained model written offline (:mod:`.pretrained`, ``lhr prepare-model``), the tiny CPU model
(:mod:`.tiny_model`), the run's one model directory (:mod:`.model_path`) and the model on disk before a fit
(:mod:`.run_model`)."""
