"""The syncpack command line as a file spark-submit can run (it runs Python programs by path).

    spark-submit --master spark://head:7077 --deploy-mode client samples/spark/submit.py \
        --site /srv/boston export --all --out /media/usb --engine spark \
        --spark-master spark://head:7077 --log /shared/boston-log --staging /shared/tmp

See docs/cluster.md.
"""

from syncpack.cli import main

main()
