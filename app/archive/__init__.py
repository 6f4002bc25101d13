"""The archive: every accepted event and what each answer showed, kept as Parquet by day
(recsys-archive), for retraining, judging a release and answering what happened."""
