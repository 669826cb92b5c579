"""Exporting trained models to other inference engines (today: CTranslate2, ``rpr_mt.export.ctranslate2``)."""
