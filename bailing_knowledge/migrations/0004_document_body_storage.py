from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("bailing_knowledge", "0003_knowledgebase_language")]

    operations = []
