# /etc/profile.d/collocate.sh: point every member's shell at the lab's daemon (docs/lab.md).
# With this, `collocate submit`, `ls`, `logs`, `dashboard`... need no --state-dir. (A shell
# without it still finds /var/lib/collocate-lab/collocate.sock: clients try it first.)
export COLLOCATE_STATE_DIR=/var/lib/collocate-lab
case ":$PATH:" in
  *:/opt/collocate/bin:*) ;;
  *) PATH="$PATH:/opt/collocate/bin"; export PATH ;;
esac
