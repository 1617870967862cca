R=$PWD
for i in 1 2; do for d in prev v2 now v3; do
  root=$R; [[ $d == now ]] || root=$R/.$d
  fams=mamba2,gdn; [[ $d == v2 ]] && fams=mamba2
  (cd $root && PYTHONPATH=$root:/tmp/site timeout 150 python $R/benchmarks/layer_speed.py --families $fams --tokens 4096 --configs nvfp4/fp16sr@16,nvfp4:scale=row/fp16sr@16,shared:nvfp4@16 --out $OUT/rep_${i}_$d.json > $OUT/rep_${i}_$d.log 2>&1)
  echo "== $i $d rc $?"
  python3 -c "
import json,sys
for l in open('$OUT/rep_${i}_$d.log'):
    if l.startswith('{'):
        r=json.loads(l); print(r['family'], r['config'], round(r['tokens_per_s']/1e3,1))"
done; done
